package network

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sbxdev/sbx/internal/connlimit"
)

// Egress proxy: nftables redirects a proxied box's (Policy.proxied) new TCP
// connections to the egress ports to this listener on the gateway. For each
// connection it finds the box by source address and the original
// destination (SO_ORIGINAL_DST), peeks at the first bytes and decides:
//
//   - TLS: the ClientHello's SNI is the host name. Hosts of the box's domain
//     secrets are intercepted (TLS terminated with a certificate from the
//     daemon's CA, requests handled as for HTTP below, TLS re-originated to
//     the real server, verified); there, placeholders of secrets whose
//     domains match the request's Host are replaced in the headers each
//     secret names (Authorization by default) and, if it opts in, the URL
//     query — nowhere else. Every other host is passed through untouched.
//   - HTTP: every request's Host is checked (keep-alive connections may
//     switch hosts) and the request is sent on. Secrets are never put in
//     plain HTTP: a request carrying a placeholder to a secret's host is
//     refused (403 saying to use HTTPS).
//   - Anything else has no host name.
//
// Which host names may pass and where the proxy connects (route): in
// ModeAllow the name must match allow_domains, and the proxy connects to
// what the daemon's upstream resolvers say the name is (never blindly to
// the box's destination, so a made-up SNI or Host towards another address
// gets nowhere); an address literal or no name passes only when
// allow_cidrs cover it. In ModePublic the box may reach any public address
// anyway, so the proxy connects to the original destination except for
// hosts of secrets, which are resolved. Every address connected to must
// pass the policy's address rules (permitted): never the host itself (any
// of its addresses, whatever allow_cidrs say), the sandbox subnet,
// loopback, or — unless allow_cidrs say so — private, link-local
// (metadata) and other blocked ranges.

// egressBox is what the proxy knows of the box behind a source address.
type egressBox struct {
	owner  string
	policy Policy
}

// egressProxy serves the redirected connections.
type egressProxy struct {
	ln     net.Listener
	port   uint16
	subnet netip.Prefix
	// localAddr, if set, replaces the host's interface addresses (tests).
	localAddr func(netip.Addr) bool
	lookup    func(src netip.Addr) (egressBox, bool)
	resolve   func(ctx context.Context, host string) ([]netip.Addr, error)
	ca        *egressCA
	roots     *x509.CertPool
	log       *slog.Logger
	errLog    *log.Logger
	// dialTimeout bounds connecting upstream; peekTimeout waiting for the
	// box's first bytes; idleTimeout a passed-through connection on which
	// neither side sends anything.
	dialTimeout, peekTimeout, idleTimeout time.Duration
	// maxConns bounds the connections one box holds open through the
	// proxy (each costs the daemon two descriptors and a few goroutines);
	// conns counts them.
	maxConns int
	conns    *connlimit.Counter[netip.Addr]

	wg sync.WaitGroup
	mu sync.Mutex
	// The fields below are guarded by mu.
	boxes map[netip.Addr]map[*proxyConn]struct{} // open box connections by source (egressconns.go)
}

// newEgressRoots is the host's roots plus the PEM files given.
func newEgressRoots(files []string) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read egress root CA file: %w", err)
		}
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("egress root CA file %s: no PEM certificates", f)
		}
	}
	return pool, nil
}

// startEgress listens on addr (the gateway, port 0: any) and serves.
func startEgress(addr string, p *egressProxy) error {
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		return fmt.Errorf("listen for egress proxy on %s: %w", addr, err)
	}
	p.ln = ln
	p.port = uint16(ln.Addr().(*net.TCPAddr).Port)
	p.boxes = map[netip.Addr]map[*proxyConn]struct{}{}
	p.errLog = log.New(io.Discard, "", 0)
	if p.dialTimeout == 0 {
		p.dialTimeout = 10 * time.Second
	}
	if p.peekTimeout == 0 {
		p.peekTimeout = 10 * time.Second
	}
	if p.idleTimeout == 0 {
		p.idleTimeout = DefaultLimits.EgressIdleTimeout
	}
	if p.maxConns == 0 {
		p.maxConns = DefaultLimits.EgressConns
	}
	p.conns = connlimit.NewCounter[netip.Addr](p.maxConns, p.log, "egress proxy connections")
	p.wg.Add(1)
	go p.serve()
	return nil
}

// close stops accepting and cuts the connections in flight.
func (p *egressProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.closeAllLocked()
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *egressProxy) serve() {
	defer p.wg.Done()
	bo := connlimit.Backoff{Log: p.log, What: "egress accept"}
	for {
		c, err := connlimit.Accept(p.ln, &bo)
		if err != nil {
			return // closed
		}
		pc := &proxyConn{src: c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()}
		release, ok := p.conns.Acquire(pc.src)
		if !ok {
			_ = c.(*net.TCPConn).SetLinger(0) // a reset: no TIME_WAIT for a flood
			c.Close()
			continue
		}
		p.track(pc, c)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() {
				p.untrack(pc)
				c.Close()
				release()
			}()
			p.handle(pc, c.(*net.TCPConn))
		}()
	}
}

// clientConn is one connection from a box.
type clientConn struct {
	src  netip.Addr
	orig netip.AddrPort // where the box wanted to go
	box  egressBox
	pc   *proxyConn // its entry in the proxy's table
}

func (p *egressProxy) handle(pc *proxyConn, c *net.TCPConn) {
	src := pc.src
	box, ok := p.lookup(src)
	if !ok || !box.policy.proxied() {
		return // not a proxied box (or one going away)
	}
	orig, err := originalDst(c)
	if err != nil || orig.Port() == p.port && p.isLocal(orig.Addr()) {
		return // not redirected: someone dialled the proxy directly
	}
	cc := &clientConn{src: src, orig: orig, box: box, pc: pc}
	log := p.log.With("sandbox", box.owner, "dst", orig)
	br := bufio.NewReaderSize(c, 4096)
	_ = c.SetReadDeadline(time.Now().Add(p.peekTimeout))
	first, err := br.Peek(1)
	_ = c.SetReadDeadline(time.Time{})
	conn := &peekedConn{Conn: c, r: br}
	switch {
	case err == nil && first[0] == 0x16: // TLS handshake record
		p.handleTLS(cc, conn, log)
	case err == nil && looksLikeHTTP(br):
		p.serveHTTP(cc, conn, false, log)
	default: // no name: a silent client or another protocol
		target, err := p.route(cc, "")
		if err == nil {
			err = p.setRoute(pc, "", target)
		}
		if err != nil {
			log.Info("egress: blocked", "reason", err)
			return
		}
		p.splice(pc, conn, target, log)
	}
}

// looksLikeHTTP reports whether the buffered bytes start with an HTTP
// method and a space.
func looksLikeHTTP(br *bufio.Reader) bool {
	b, _ := br.Peek(8)
	i := bytes.IndexByte(b, ' ')
	if i < 3 {
		return false
	}
	for _, ch := range b[:i] {
		if ch < 'A' || ch > 'Z' {
			return false
		}
	}
	return true
}

// errBlocked is a connection or request the policy does not allow.
type errBlocked struct{ why string }

func (e errBlocked) Error() string { return e.why }

// route decides where a connection for host (SNI or Host without port;
// "" when the box sent none) goes, or why it may not.
func (p *egressProxy) route(cc *clientConn, host string) (netip.AddrPort, error) {
	pol := cc.box.policy
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	port := cc.orig.Port()
	if host == "" {
		if pol.Mode == ModeAllow && !inPrefixes(pol.AllowCIDRs, cc.orig.Addr()) {
			return netip.AddrPort{}, errBlocked{"no host name (TLS without SNI or not HTTP) to " + cc.orig.Addr().String() + ", which allow_cidrs do not cover"}
		}
		return p.checked(pol, cc.orig)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if pol.Mode == ModeAllow && !inPrefixes(pol.AllowCIDRs, a) {
			return netip.AddrPort{}, errBlocked{"address " + host + " is not in allow_cidrs"}
		}
		return p.checked(pol, netip.AddrPortFrom(a.Unmap(), port))
	}
	if pol.Mode == ModeAllow && !MatchDomain(pol.AllowDomains, host) {
		return netip.AddrPort{}, errBlocked{"host " + host + " is not in allow_domains"}
	}
	if pol.Mode == ModePublic && secretsFor(pol, host) == nil {
		return p.checked(pol, cc.orig)
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.dialTimeout)
	defer cancel()
	addrs, err := p.resolve(ctx, host)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("resolve %s: %w", host, err)
	}
	var refused []string
	for _, a := range addrs {
		if p.permitted(pol, netip.AddrPortFrom(a, port)) {
			return netip.AddrPortFrom(a, port), nil
		}
		refused = append(refused, a.String())
	}
	if len(refused) > 0 {
		return netip.AddrPort{}, errBlocked{fmt.Sprintf("host %s resolves to blocked addresses %v", host, refused)}
	}
	return netip.AddrPort{}, fmt.Errorf("host %s has no IPv4 address", host)
}

func (p *egressProxy) checked(pol Policy, ap netip.AddrPort) (netip.AddrPort, error) {
	if !p.permitted(pol, ap) {
		return netip.AddrPort{}, errBlocked{"address " + ap.Addr().String() + " is blocked by the network policy"}
	}
	return ap, nil
}

// permitted applies a policy's address rules to a destination the proxy
// would connect to, as the box's own chains would (rules.go): never the
// host's own addresses (whatever allow_cidrs say: the input chain opens
// nothing but DNS and this proxy), other boxes, loopback or deny_cidrs;
// blocked ranges only where allow_cidrs cover them.
func (p *egressProxy) permitted(pol Policy, ap netip.AddrPort) bool {
	a := ap.Addr().Unmap()
	if !a.Is4() || a.IsLoopback() || a.IsUnspecified() || inPrefixes(pol.DenyCIDRs, a) {
		return false
	}
	if p.isLocal(a) || p.subnet.Contains(a) {
		return false
	}
	if inPrefixes(pol.AllowCIDRs, a) {
		return true
	}
	return !inPrefixes(blockedRanges, a)
}

// isLocal reports whether a is an address of this host.
func (p *egressProxy) isLocal(a netip.Addr) bool {
	if p.localAddr != nil {
		return p.localAddr(a)
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return true // fail closed
	}
	for _, ia := range addrs {
		if n, ok := ia.(*net.IPNet); ok {
			if la, ok := netip.AddrFromSlice(n.IP); ok && la.Unmap() == a {
				return true
			}
		}
	}
	return false
}

func inPrefixes(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// secretsFor returns the secrets whose domains match host.
func secretsFor(pol Policy, host string) []Secret {
	var out []Secret
	for _, s := range pol.Secrets {
		if MatchDomain(s.Domains, host) {
			out = append(out, s)
		}
	}
	return out
}

// handleTLS reads the ClientHello for its SNI, then intercepts (hosts of
// secrets) or passes the connection through.
func (p *egressProxy) handleTLS(cc *clientConn, conn *peekedConn, log *slog.Logger) {
	_ = conn.SetReadDeadline(time.Now().Add(p.peekTimeout))
	sni, hello, err := readClientHello(conn.r)
	_ = conn.SetReadDeadline(time.Time{})
	if err != nil {
		log.Info("egress: blocked", "reason", "unreadable TLS ClientHello: "+err.Error())
		return
	}
	conn.r = bufio.NewReader(io.MultiReader(bytes.NewReader(hello), conn.r))
	if sni != "" && secretsFor(cc.box.policy, sni) != nil {
		if _, err := p.route(cc, sni); err != nil {
			log.Info("egress: blocked", "sni", sni, "reason", err)
			return
		}
		tc := tls.Server(conn, &tls.Config{
			MinVersion: tls.VersionTLS12,
			NextProtos: []string{"http/1.1"},
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
				return p.ca.certFor(sni)
			},
		})
		if err := tc.Handshake(); err != nil {
			log.Info("egress: TLS handshake with the box failed (does it trust the sbx CA?)", "sni", sni, "err", err)
			return
		}
		p.serveHTTP(cc, tc, true, log)
		return
	}
	target, err := p.route(cc, sni)
	if err == nil {
		err = p.setRoute(cc.pc, sni, target)
	}
	if err != nil {
		log.Info("egress: blocked", "sni", sni, "reason", err)
		return
	}
	p.splice(cc.pc, conn, target, log)
}

// readClientHello reads a TLS ClientHello from r and returns its server
// name and the bytes read. crypto/tls parses it: a handshake on a conn that
// can only be read from stops in GetConfigForClient.
func readClientHello(r io.Reader) (string, []byte, error) {
	var buf bytes.Buffer
	var sni string
	var got bool
	errDone := errors.New("done")
	err := tls.Server(readOnlyConn{r: io.TeeReader(r, &buf)}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			sni, got = h.ServerName, true
			return nil, errDone
		},
	}).Handshake()
	if !got {
		return "", nil, err
	}
	return sni, buf.Bytes(), nil
}

// serveHTTP serves the requests of one box connection (plain, or TLS
// terminated here) and forwards them upstream one by one.
func (p *egressProxy) serveHTTP(cc *clientConn, conn net.Conn, isTLS bool, log *slog.Logger) {
	scheme := "http"
	if isTLS {
		scheme = "https"
	}
	// A transport per box connection: upstream connections are never shared
	// between boxes (their policies differ), and go when the box's does.
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			target, ok := ctx.Value(targetKey{}).(netip.AddrPort)
			if !ok {
				return nil, errors.New("no route")
			}
			return p.dialUpstream(cc.pc, func() (net.Conn, error) {
				d := net.Dialer{Timeout: p.dialTimeout}
				return d.DialContext(ctx, "tcp4", target.String())
			})
		},
		TLSClientConfig:       &tls.Config{RootCAs: p.roots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:     false,
		DisableCompression:    true,
		MaxIdleConnsPerHost:   2,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   p.dialTimeout,
		ResponseHeaderTimeout: 0,
	}
	defer tr.CloseIdleConnections()
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = scheme
			pr.Out.URL.Host = pr.In.Host
			pr.Out.Host = pr.In.Host
		},
		Transport: tr,
		ErrorLog:  p.errLog,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			log.Info("egress: upstream failed", "host", r.Host, "err", err)
			http.Error(w, "sbx egress proxy: "+r.Host+": upstream failed: "+err.Error(), http.StatusBadGateway)
		},
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		host = strings.TrimSuffix(strings.ToLower(host), ".")
		// The box's policy may have changed since the connection began.
		box, ok := p.lookup(cc.src)
		if !ok || !box.policy.proxied() {
			http.Error(w, "sbx egress proxy: sandbox network changed", http.StatusForbidden)
			return
		}
		cc.box = box
		target, err := p.route(cc, host)
		if err == nil && host != "" {
			err = p.setRoute(cc.pc, host, target)
		}
		if err != nil {
			var b errBlocked
			code := http.StatusBadGateway
			if errors.As(err, &b) {
				code = http.StatusForbidden
			}
			log.Info("egress: blocked", "host", host, "reason", err)
			w.Header().Set("Connection", "close")
			http.Error(w, "sbx egress proxy: blocked: "+err.Error(), code)
			return
		}
		if host == "" {
			http.Error(w, "sbx egress proxy: request without Host", http.StatusBadRequest)
			return
		}
		for _, s := range secretsFor(box.policy, host) {
			if !isTLS {
				// Plain HTTP: the value would cross the network in clear
				// (and to whoever answers for the address). Never sent;
				// a request that carries the placeholder is refused so
				// that the user sees why.
				if carries(r, s.Placeholder) {
					log.Info("egress: refused a domain secret over plain HTTP", "host", host, "secret", s.Name)
					w.Header().Set("Connection", "close")
					http.Error(w, "sbx egress proxy: domain secret "+s.Name+" is only sent over HTTPS: use https://"+host, http.StatusForbidden)
					return
				}
				continue
			}
			substitute(r, s)
		}
		r = r.WithContext(context.WithValue(r.Context(), targetKey{}, target))
		rp.ServeHTTP(w, r)
	})
	// done closes when the connection is finished: closed by the server,
	// or — after an upgrade (WebSocket) hijacked it — when the handler that
	// copies the upgraded stream returns.
	done := make(chan struct{})
	var doneOnce sync.Once
	finish := func() { doneOnce.Do(func() { close(done) }) }
	var hijacked atomic.Bool
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() {
				if hijacked.Load() {
					finish()
				}
			}()
			handler.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          p.errLog,
		ConnState: func(_ net.Conn, s http.ConnState) {
			switch s {
			case http.StateClosed:
				finish()
			case http.StateHijacked:
				hijacked.Store(true)
			}
		},
	}
	srv.SetKeepAlivesEnabled(true)
	_ = srv.Serve(&oneConnListener{c: conn, done: done})
	<-done
}

type targetKey struct{}

// substitute replaces s's placeholder by its value where s allows it: in
// the headers it names (also inside Basic credentials) and, with
// AllowQuery, in the URL query. Every other header, the path and the body
// keep the placeholder: an upstream that echoes a request can hand back
// only what the user chose to send it.
func substitute(r *http.Request, s Secret) {
	if s.Placeholder == "" {
		return
	}
	for _, k := range s.headers() {
		vs := r.Header[k]
		for i, v := range vs {
			v = strings.ReplaceAll(v, s.Placeholder, s.Value)
			vs[i] = substituteBasic(v, s.Placeholder, s.Value)
		}
	}
	if s.AllowQuery && strings.Contains(r.URL.RawQuery, s.Placeholder) {
		r.URL.RawQuery = strings.ReplaceAll(r.URL.RawQuery, s.Placeholder, urlQueryEscape(s.Value))
	}
}

// carries reports whether placeholder appears anywhere substitute could
// put a value: any header (also inside Basic credentials), the URL.
func carries(r *http.Request, placeholder string) bool {
	if placeholder == "" {
		return false
	}
	if strings.Contains(r.URL.String(), placeholder) {
		return true
	}
	for _, vs := range r.Header {
		for _, v := range vs {
			if strings.Contains(v, placeholder) || substituteBasic(v, placeholder, "") != v {
				return true
			}
		}
	}
	return false
}

func substituteBasic(v, placeholder, value string) string {
	scheme, cred, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "basic") {
		return v
	}
	dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil || !bytes.Contains(dec, []byte(placeholder)) {
		return v
	}
	return scheme + " " + base64.StdEncoding.EncodeToString(bytes.ReplaceAll(dec, []byte(placeholder), []byte(value)))
}

// urlQueryEscape escapes every byte but RFC 3986's unreserved ones, so the
// value stays one value whatever separators the upstream splits on (";" as
// well as "&").
func urlQueryEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~", c) >= 0) {
			b.WriteString("%" + strings.ToUpper(strconv.FormatUint(uint64(c)|0x100, 16)[1:]))
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// splice connects to target, sends what the box sent so far and copies
// both ways until either side is done.
func (p *egressProxy) splice(pc *proxyConn, conn *peekedConn, target netip.AddrPort, log *slog.Logger) {
	up, err := p.dialUpstream(pc, func() (net.Conn, error) {
		d := net.Dialer{Timeout: p.dialTimeout}
		return d.Dial("tcp4", target.String())
	})
	if err != nil {
		log.Info("egress: connect failed", "target", target, "err", err)
		return
	}
	defer up.Close()
	idle := newIdleWatch(p.idleTimeout)
	errc := make(chan error, 2)
	go func() {
		err := idle.copy(up, conn.r, conn.Conn)
		if tc, ok := up.(*trackedConn).Conn.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		errc <- err
	}()
	go func() {
		err := idle.copy(conn.Conn, up, up)
		if tc, ok := conn.Conn.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		errc <- err
	}()
	if err := <-errc; errors.Is(err, errIdle) {
		log.Info("egress: idle connection closed", "target", target, "idle", p.idleTimeout)
		conn.Close()
		up.Close()
	}
	<-errc
}

// peekedConn is a conn whose reads go through r (which holds peeked bytes).
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *peekedConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// readOnlyConn lets crypto/tls read a ClientHello and nothing else.
type readOnlyConn struct {
	net.Conn
	r io.Reader
}

func (c readOnlyConn) Read(b []byte) (int, error)         { return c.r.Read(b) }
func (c readOnlyConn) Write(b []byte) (int, error)        { return 0, io.ErrClosedPipe }
func (c readOnlyConn) Close() error                       { return nil }
func (c readOnlyConn) LocalAddr() net.Addr                { return &net.TCPAddr{} }
func (c readOnlyConn) RemoteAddr() net.Addr               { return &net.TCPAddr{} }
func (c readOnlyConn) SetDeadline(t time.Time) error      { return nil }
func (c readOnlyConn) SetReadDeadline(t time.Time) error  { return nil }
func (c readOnlyConn) SetWriteDeadline(t time.Time) error { return nil }

// oneConnListener hands one conn to an http.Server, then blocks until it
// is done so that Serve returns only after the connection.
type oneConnListener struct {
	c    net.Conn
	done chan struct{}
	once sync.Once
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = l.c })
	if c != nil {
		return c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error   { return nil }
func (l *oneConnListener) Addr() net.Addr { return l.c.LocalAddr() }
