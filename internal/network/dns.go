package network

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/sbxdev/sbx/internal/connlimit"
	"github.com/sbxdev/sbx/internal/errdefs"
)

// DNS forwarder: sandboxes' only resolver. It listens on the bridge address
// (UDP and TCP port 53), looks the asking box up by source address, refuses
// names its policy does not allow (ModeAllow), forwards the rest verbatim to
// the host's resolvers and, in ModeAllow, adds the A records of each answer
// to the box's firewall set before passing the answer on — so a name's
// addresses are reachable by the time the box learns them.

// dnsClient is what the forwarder needs to know about boxes.
type dnsClient struct {
	// policy returns the policy and slot name of the box at src.
	policy func(src netip.Addr) (Policy, string, bool)
	// allow makes addrs reachable for the slot (ModeAllow answers) for
	// about ttl (the answer's TTL; see learnedTimeout).
	allow func(slot string, addrs []netip.Addr, ttl time.Duration) error
}

type dnsForwarder struct {
	upstreams []string // host:port
	client    dnsClient
	log       *slog.Logger
	timeout   time.Duration
	lim       Limits

	udp *net.UDPConn
	tcp *net.TCPListener
	wg  sync.WaitGroup
	sem chan struct{} // bounds queries in flight, all boxes together
	// Per box (by source address): queries a second, TCP connections
	// open, queries in flight upstream.
	rate     *connlimit.Rate[netip.Addr]
	tcpConns *connlimit.Counter[netip.Addr]
	inFlight *connlimit.Counter[netip.Addr]
}

// DNS header constants.
const (
	dnsRcodeServFail = 2
	dnsRcodeRefused  = 5
	dnsMaxUDP        = 4096
	// dnsMaxInFlight bounds the queries in flight, all boxes together.
	dnsMaxInFlight = 256
)

// startDNS listens on addr (UDP and TCP) and serves until close; lim
// bounds each box (zero fields: DefaultLimits).
func startDNS(addr string, upstreams []string, c dnsClient, lim Limits, log *slog.Logger) (*dnsForwarder, error) {
	lim.setDefaults()
	f := &dnsForwarder{upstreams: upstreams, client: c, log: log, timeout: 3 * time.Second, lim: lim,
		sem:      make(chan struct{}, dnsMaxInFlight),
		rate:     connlimit.NewRate[netip.Addr](lim.DNSQueriesPerSec, 2*lim.DNSQueriesPerSec, log, "dns queries per second"),
		tcpConns: connlimit.NewCounter[netip.Addr](lim.DNSTCPConns, log, "dns tcp connections"),
		inFlight: connlimit.NewCounter[netip.Addr](lim.DNSInFlight, log, "dns queries in flight"),
	}
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, err
	}
	if f.udp, err = net.ListenUDP("udp", ua); err != nil {
		return nil, err
	}
	// Room for bursts from many boxes while the loop drops a flood (the
	// kernel caps it at net.core.rmem_max).
	_ = f.udp.SetReadBuffer(4 << 20)
	port := f.udp.LocalAddr().(*net.UDPAddr).Port // the same port when ua asked for any
	if f.tcp, err = net.ListenTCP("tcp", &net.TCPAddr{IP: ua.IP, Port: port}); err != nil {
		f.udp.Close()
		return nil, err
	}
	f.wg.Add(2)
	go f.serveUDP()
	go f.serveTCP()
	return f, nil
}

// addr returns the UDP address served (for tests using port 0).
func (f *dnsForwarder) addr() string { return f.udp.LocalAddr().String() }

func (f *dnsForwarder) close() {
	f.udp.Close()
	f.tcp.Close()
	f.wg.Wait()
}

// admit takes a query slot for src: its rate, its in-flight share and the
// forwarder's; release gives the slots back. false: drop (or refuse) it.
func (f *dnsForwarder) admit(src netip.Addr) (release func(), ok bool) {
	if !f.rate.Allow(src) {
		return nil, false
	}
	rel, ok := f.inFlight.Acquire(src)
	if !ok {
		return nil, false
	}
	select {
	case f.sem <- struct{}{}:
		return func() { <-f.sem; rel() }, true
	default:
		rel()
		return nil, false
	}
}

func (f *dnsForwarder) serveUDP() {
	defer f.wg.Done()
	bo := connlimit.Backoff{Log: f.log, What: "dns udp read"}
	for {
		buf := make([]byte, dnsMaxUDP)
		n, src, err := f.udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			bo.Failed(err)
			continue
		}
		bo.OK()
		release, ok := f.admit(src.Addr().Unmap())
		if !ok {
			continue // over a limit: drop, the client retries
		}
		f.wg.Add(1)
		go func() {
			defer func() { release(); f.wg.Done() }()
			if resp := f.handle(src.Addr().Unmap(), buf[:n], "udp"); resp != nil {
				_, _ = f.udp.WriteToUDPAddrPort(resp, src)
			}
		}()
	}
}

func (f *dnsForwarder) serveTCP() {
	defer f.wg.Done()
	bo := connlimit.Backoff{Log: f.log, What: "dns tcp accept"}
	for {
		c, err := connlimit.Accept(f.tcp, &bo)
		if err != nil {
			return // closed
		}
		src := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
		done, ok := f.tcpConns.Acquire(src)
		if !ok {
			_ = c.(*net.TCPConn).SetLinger(0) // a reset: no TIME_WAIT for a flood
			c.Close()
			continue
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer done()
			defer c.Close()
			r := bufio.NewReader(c)
			for {
				// Idle or slow: a box may keep a connection open for one
				// idle timeout after its last query.
				_ = c.SetDeadline(time.Now().Add(f.lim.DNSTCPIdleTimeout))
				msg, err := readTCPMsg(r)
				if err != nil {
					return
				}
				var resp []byte
				if release, ok := f.admit(src); ok {
					resp = f.handle(src, msg, "tcp")
					release()
				} else if _, ok := questionName(msg); ok {
					resp = errorReply(msg, dnsRcodeServFail)
				}
				if resp == nil || writeTCPMsg(c, resp) != nil {
					return
				}
			}
		}()
	}
}

func readTCPMsg(r io.Reader) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	msg := make([]byte, binary.BigEndian.Uint16(l[:]))
	_, err := io.ReadFull(r, msg)
	return msg, err
}

func writeTCPMsg(w io.Writer, msg []byte) error {
	b := make([]byte, 2+len(msg))
	binary.BigEndian.PutUint16(b, uint16(len(msg)))
	copy(b[2:], msg)
	_, err := w.Write(b)
	return err
}

// handle answers one query; nil means no answer at all (garbage).
func (f *dnsForwarder) handle(src netip.Addr, q []byte, proto string) []byte {
	name, ok := questionName(q)
	if !ok {
		return nil
	}
	pol, slot, known := f.client.policy(src)
	if !known || pol.Mode == ModeNone {
		return errorReply(q, dnsRcodeRefused)
	}
	if pol.Mode == ModeAllow && !MatchDomain(pol.AllowDomains, name) {
		f.log.Debug("dns: refused", "src", src, "name", name)
		return errorReply(q, dnsRcodeRefused)
	}
	resp, err := f.forward(q, proto)
	if err != nil {
		f.log.Debug("dns: upstream failed", "name", name, "err", err)
		return errorReply(q, dnsRcodeServFail)
	}
	if pol.Mode == ModeAllow {
		if addrs, ttl := answerA(resp); len(addrs) > 0 {
			if err := f.client.allow(slot, addrs, ttl); err != nil {
				f.log.Warn("dns: allowing answer addresses", "name", name, "err", err)
				return errorReply(q, dnsRcodeServFail)
			}
		}
	}
	return resp
}

// forward sends q to each upstream in turn until one answers.
func (f *dnsForwarder) forward(q []byte, proto string) ([]byte, error) {
	err := errors.New("no upstream resolvers")
	for _, up := range f.upstreams {
		var resp []byte
		if resp, err = exchange(up, q, proto, f.timeout); err == nil {
			return resp, nil
		}
	}
	return nil, err
}

func exchange(server string, q []byte, proto string, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, proto, server)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if proto == "tcp" {
		if err := writeTCPMsg(c, q); err != nil {
			return nil, err
		}
		return readTCPMsg(c)
	}
	if _, err := c.Write(q); err != nil {
		return nil, err
	}
	buf := make([]byte, dnsMaxUDP)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return nil, err
		}
		if n >= 2 && buf[0] == q[0] && buf[1] == q[1] { // matching id
			return buf[:n], nil
		}
	}
}

// The forwarder reads only what its policy needs from a message and passes
// the rest on verbatim; golang.org/x/net/dns/dnsmessage does the reading.
// It refuses what would let the name the policy checks differ from the name
// the upstream resolver is asked: labels with dots in them ("evil.allowed"
// as one label reads as two), names over 255 bytes, reserved label types,
// and chains of more than 10 compression pointers.

// questionName returns the name (without its trailing dot, "" for the
// root) of a query's one question.
func questionName(msg []byte) (string, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil || h.Response || binary.BigEndian.Uint16(msg[4:]) != 1 {
		return "", false // short, a response, or not exactly one question
	}
	q, err := p.Question()
	if err != nil {
		return "", false
	}
	return strings.TrimSuffix(q.Name.String(), "."), true
}

// answerAddrs returns the IPv4 addresses of a response's answer section.
func answerAddrs(msg []byte) []netip.Addr {
	addrs, _ := answerA(msg)
	return addrs
}

// answerA walks a response's answer section: the IPv4 addresses of its A
// records (class IN), and the smallest TTL among them. A truncated or
// malformed message yields what came before the damage.
func answerA(msg []byte) (addrs []netip.Addr, minTTL time.Duration) {
	var p dnsmessage.Parser
	if _, err := p.Start(msg); err != nil {
		return nil, 0
	}
	if err := p.SkipAllQuestions(); err != nil {
		return nil, 0
	}
	for {
		h, err := p.AnswerHeader()
		if err != nil {
			return addrs, minTTL
		}
		if h.Type != dnsmessage.TypeA || h.Class != dnsmessage.ClassINET {
			if p.SkipAnswer() != nil {
				return addrs, minTTL
			}
			continue
		}
		a, err := p.AResource()
		if err != nil {
			return addrs, minTTL
		}
		ttl := time.Duration(h.TTL) * time.Second
		if len(addrs) == 0 || ttl < minTTL {
			minTTL = ttl
		}
		addrs = append(addrs, netip.AddrFrom4(a.A))
	}
}

// errorReply turns query q (one questionName accepted) into an empty
// response with rcode: the same id, opcode, RD bit and question.
func errorReply(q []byte, rcode byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode,
		RecursionDesired: h.RecursionDesired, RecursionAvailable: true, RCode: dnsmessage.RCode(rcode)})
	if question, err := p.Question(); err == nil {
		if b.StartQuestions() != nil || b.Question(question) != nil {
			return nil
		}
	}
	r, err := b.Finish()
	if err != nil {
		return nil
	}
	return r
}

// hostResolvers returns the nameservers of resolv.conf as host:53.
func hostResolvers(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" {
			if a, err := netip.ParseAddr(f[1]); err == nil {
				out = append(out, netip.AddrPortFrom(a.WithZone(""), 53).String())
			}
		}
	}
	return out
}

// buildQuery makes a recursive query for name's A records. name comes
// from a box (the egress proxy resolves SNI and Host names): one that is
// not a DNS name (an empty or over-long label, over 253 characters) is
// refused rather than encoded into a query for another name.
func buildQuery(id uint16, name string) ([]byte, error) {
	bad := func(why string) ([]byte, error) {
		return nil, fmt.Errorf("dns name %.80q: %s: %w", name, why, errdefs.ErrInvalidArgument)
	}
	fqdn := strings.TrimSuffix(name, ".") + "."
	if fqdn == "." || len(fqdn) > 254 {
		return bad("empty or longer than 253 characters")
	}
	n, err := dnsmessage.NewName(fqdn)
	if err != nil {
		return bad(err.Error())
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(dnsmessage.Question{Name: n, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}); err != nil {
		return bad(err.Error())
	}
	return b.Finish()
}

// resolveA asks the upstream resolvers (not a box's view) for host's IPv4
// addresses.
func (f *dnsForwarder) resolveA(host string) ([]netip.Addr, error) {
	var id [2]byte
	_, _ = rand.Read(id[:])
	q, err := buildQuery(binary.BigEndian.Uint16(id[:]), host)
	if err != nil {
		return nil, err
	}
	resp, err := f.forward(q, "udp")
	if err != nil {
		return nil, err
	}
	if len(resp) < 12 || resp[0] != id[0] || resp[1] != id[1] {
		return nil, errors.New("bad DNS answer")
	}
	if rc := resp[3] & 0x0F; rc != 0 {
		return nil, fmt.Errorf("DNS rcode %d", rc)
	}
	return answerAddrs(resp), nil
}
