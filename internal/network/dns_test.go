package network

import (
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// answer makes the response of a tiny authoritative server: A records for
// known names, NXDOMAIN for the rest.
func answer(q []byte, zone map[string][]netip.Addr) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil
	}
	question, err := p.Question()
	if err != nil {
		return nil
	}
	addrs := zone[strings.ToLower(strings.TrimSuffix(question.Name.String(), "."))]
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	if addrs == nil {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	_ = b.StartQuestions()
	_ = b.Question(question)
	_ = b.StartAnswers()
	for _, a := range addrs {
		_ = b.AResource(dnsmessage.ResourceHeader{Name: question.Name, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: a.As4()})
	}
	r, err := b.Finish()
	if err != nil {
		return nil
	}
	return r
}

// startTestDNS serves zone on a loopback UDP and TCP port.
func startTestDNS(t *testing.T, zone map[string][]netip.Addr) string {
	t.Helper()
	// The UDP port picked may be taken for TCP by someone else: retry.
	var pc net.PacketConn
	var ln net.Listener
	for attempt := 0; ; attempt++ {
		var err error
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if ln, err = net.Listen("tcp", pc.LocalAddr().String()); err == nil {
			break
		}
		pc.Close()
		if attempt == 20 {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { pc.Close(); ln.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if r := answer(buf[:n], zone); r != nil {
				_, _ = pc.WriteTo(r, from)
			}
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for {
					q, err := readTCPMsg(c)
					if err != nil {
						return
					}
					if writeTCPMsg(c, answer(q, zone)) != nil {
						return
					}
				}
			}()
		}
	}()
	return pc.LocalAddr().String()
}

func TestDNSForwarderFilters(t *testing.T) {
	zone := map[string][]netip.Addr{
		"a.allowed.test": {netip.MustParseAddr("198.51.100.10"), netip.MustParseAddr("198.51.100.11")},
		"blocked.test":   {netip.MustParseAddr("198.51.100.20")},
	}
	upstream := startTestDNS(t, zone)
	var mu sync.Mutex
	pol := Policy{Mode: ModeAllow, AllowDomains: []string{"*.allowed.test"}}
	var learned []netip.Addr
	var ttls []time.Duration
	client := dnsClient{
		policy: func(src netip.Addr) (Policy, string, bool) {
			mu.Lock()
			defer mu.Unlock()
			return pol, "n1", src == netip.MustParseAddr("127.0.0.1")
		},
		allow: func(slot string, addrs []netip.Addr, ttl time.Duration) error {
			mu.Lock()
			defer mu.Unlock()
			learned = append(learned, addrs...)
			ttls = append(ttls, ttl)
			return nil
		},
	}
	f, err := startDNS("127.0.0.1:0", []string{upstream}, client, Limits{}, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()

	ask := func(proto, name string) (rcode byte, addrs []netip.Addr) {
		t.Helper()
		c, err := net.DialTimeout(proto, f.addr(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		q := mustQuery(t, 0x1234, name)
		var r []byte
		if proto == "tcp" {
			if err := writeTCPMsg(c, q); err != nil {
				t.Fatal(err)
			}
			r, err = readTCPMsg(c)
		} else {
			_, _ = c.Write(q)
			buf := make([]byte, 512)
			var n int
			n, err = c.Read(buf)
			r = buf[:n]
		}
		if err != nil {
			t.Fatalf("%s query %s: %v", proto, name, err)
		}
		if r[0] != 0x12 || r[1] != 0x34 || r[2]&0x80 == 0 {
			t.Fatalf("%s query %s: reply %x is not a response to it", proto, name, r)
		}
		return r[3] & 0x0F, answerAddrs(r)
	}

	for _, proto := range []string{"udp", "tcp"} {
		rc, addrs := ask(proto, "A.Allowed.Test")
		if rc != 0 || len(addrs) != 2 {
			t.Errorf("%s allowed name: rcode %d, addrs %v; want 0 and two addresses", proto, rc, addrs)
		}
		if rc, _ := ask(proto, "blocked.test"); rc != dnsRcodeRefused {
			t.Errorf("%s blocked name: rcode %d, want REFUSED", proto, rc)
		}
		if rc, _ := ask(proto, "nx.allowed.test"); rc != 3 {
			t.Errorf("%s unknown allowed name: rcode %d, want NXDOMAIN passed through", proto, rc)
		}
	}
	mu.Lock()
	if len(learned) != 4 || learned[0] != netip.MustParseAddr("198.51.100.10") {
		t.Errorf("learned %v, want the two answers twice", learned)
	}
	for _, ttl := range ttls {
		if ttl != 60*time.Second {
			t.Errorf("learned with TTL %v, want the answer's 60s", ttl)
		}
	}
	// Public: everything is forwarded, nothing learned.
	pol, learned = Policy{Mode: ModePublic}, nil
	mu.Unlock()
	if rc, addrs := ask("udp", "blocked.test"); rc != 0 || len(addrs) != 1 {
		t.Errorf("public: rcode %d addrs %v, want the answer", rc, addrs)
	}
	mu.Lock()
	if len(learned) != 0 {
		t.Errorf("public mode learned %v", learned)
	}
	mu.Unlock()
}

func TestDNSParsingRejectsGarbage(t *testing.T) {
	for _, msg := range [][]byte{nil, {1, 2, 3}, append(mustQuery(t, 1, "a.b")[:12], 0xC0, 12)} {
		if name, ok := questionName(msg); ok {
			t.Errorf("questionName(%x) = %q, want failure", msg, name)
		}
	}
	if got := answerAddrs([]byte{0, 0, 0x80, 0, 0, 0, 0, 9, 0, 0, 0, 0}); got != nil {
		t.Errorf("answerAddrs of a truncated message = %v", got)
	}
}
