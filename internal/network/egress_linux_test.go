package network

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/sbxdev/sbx/internal/testutil"
)

// The test internet of the egress tests: a network namespace whose
// loopback holds every address below, each routed to it from the host by
// routes the test adds and removes, so nothing leaves this machine.
const (
	egAllowed  = "198.51.100.111" // allowed.test
	egEvil     = "198.51.100.112" // evil.test, other.test
	egWild     = "198.51.100.113" // x.wild.test
	egSecret   = "198.51.100.114" // api.secret.test
	egMetadata = "169.254.169.254"
	egPrivate  = "10.79.0.10"
)

var egZone = map[string][]netip.Addr{
	"allowed.test":    {netip.MustParseAddr(egAllowed)},
	"evil.test":       {netip.MustParseAddr(egEvil)},
	"other.test":      {netip.MustParseAddr(egEvil)},
	"x.wild.test":     {netip.MustParseAddr(egWild)},
	"wild.test":       {netip.MustParseAddr(egWild)},
	"meta.wild.test":  {netip.MustParseAddr(egMetadata)},
	"priv.wild.test":  {netip.MustParseAddr(egPrivate)},
	"api.secret.test": {netip.MustParseAddr(egSecret)},
	"nocert.test":     {netip.MustParseAddr(egEvil)}, // its certificate does not name it
}

func runCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
}

// testCA makes a CA and a server certificate for names, signed by it.
func testCA(t *testing.T, names ...string) (caPEM []byte, cert tls.Certificate) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caT := &x509.Certificate{SerialNumber: randSerial(), Subject: pkix.Name{CommonName: "test upstream CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caT, caT, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	lt := &x509.Certificate{SerialNumber: randSerial(), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, lt, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// echo answers with what it saw: its own address, Host, Authorization,
// X-Key and the query.
var echo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Upgrade") == "echo" { // a protocol switch, like WebSocket: echo bytes
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		_, _ = io.Copy(c, brw)
		return
	}
	la := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	fmt.Fprintf(w, "addr=%s\nhost=%s\nauth=%s\nkey=%s\nquery=%s\npath=%s\n", strings.Split(la.String(), ":")[0], r.Host,
		r.Header.Get("Authorization"), r.Header.Get("X-Key"), r.URL.RawQuery, r.URL.Path)
	// Every other header too: what an echoing host would hand back.
	for _, k := range slices.Sorted(maps.Keys(r.Header)) {
		if k != "Authorization" && k != "X-Key" {
			fmt.Fprintf(w, "hdr %s=%s\n", k, strings.Join(r.Header[k], ","))
		}
	}
})

// upstreamConns counts the connections open at each server of the test
// internet ("addr:port"), as the servers see them.
type upstreamConns struct{ m sync.Map }

func (u *upstreamConns) counter(key string) *atomic.Int32 {
	c, _ := u.m.LoadOrStore(key, new(atomic.Int32))
	return c.(*atomic.Int32)
}

// open is the number of connections open at addr ("ip:port").
func (u *upstreamConns) open(addr string) int { return int(u.counter(addr).Load()) }

// newEgressInternet builds the namespace, routes and servers (HTTP on 80
// and 8080, HTTPS on 443 with a certificate of caPEM) and returns the
// upstream CA file and the servers' open connections.
func newEgressInternet(t *testing.T) (caFile string, conns *upstreamConns) {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs the ip command (iproute2)")
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	tag := hex.EncodeToString(b)
	ns, hostVeth, peer := "sbxeg-"+tag, "sbxegh"+tag, "sbxegi"+tag
	linkHost, linkPeer := fmt.Sprintf("10.78.%d.1", b[0]), fmt.Sprintf("10.78.%d.2", b[0])
	served := []string{egAllowed, egEvil, egWild, egSecret, egMetadata, egPrivate}
	t.Cleanup(func() {
		for _, a := range served {
			_ = exec.Command("ip", "route", "del", a+"/32", "dev", hostVeth).Run()
		}
		_ = exec.Command("ip", "link", "del", hostVeth).Run()
		_ = exec.Command("ip", "netns", "del", ns).Run()
	})
	runCmd(t, "ip", "netns", "add", ns)
	runCmd(t, "ip", "link", "add", hostVeth, "type", "veth", "peer", "name", peer, "netns", ns)
	runCmd(t, "ip", "addr", "add", linkHost+"/30", "dev", hostVeth)
	runCmd(t, "ip", "link", "set", hostVeth, "up")
	nsRun := func(args ...string) { runCmd(t, append([]string{"ip", "netns", "exec", ns}, args...)...) }
	nsRun("ip", "addr", "add", linkPeer+"/30", "dev", peer)
	nsRun("ip", "link", "set", peer, "up")
	nsRun("ip", "link", "set", "lo", "up")
	for _, a := range served {
		nsRun("ip", "addr", "add", a+"/32", "dev", "lo")
		// Another test (integration) may hold the metadata route for a moment.
		var err error
		for range 100 {
			if err = exec.Command("ip", "route", "add", a+"/32", "via", linkPeer, "dev", hostVeth).Run(); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("route %s into the test internet: %v", a, err)
		}
	}
	caPEM, cert := testCA(t, "allowed.test", "evil.test", "other.test", "*.wild.test", "api.secret.test")
	caFile = filepath.Join(t.TempDir(), "upstream-ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	nsPath := "/run/netns/" + ns
	conns = &upstreamConns{}
	for _, a := range served {
		for _, port := range []string{"80", "8080", "443"} {
			ln := listenInNS(t, nsPath, a+":"+port)
			if port == "443" {
				ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}})
			}
			n := conns.counter(a + ":" + port)
			srv := &http.Server{Handler: echo, ErrorLog: log.New(io.Discard, "", 0), ConnState: func(_ net.Conn, s http.ConnState) {
				switch s {
				case http.StateNew:
					n.Add(1)
				case http.StateClosed, http.StateHijacked:
					n.Add(-1)
				}
			}}
			go func() { _ = srv.Serve(ln) }()
			t.Cleanup(func() { srv.Close() })
		}
	}
	return caFile, conns
}

func listenInNS(t *testing.T, nsPath, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	var err error
	inNetNS(t, nsPath, func() { ln, err = net.Listen("tcp", addr) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// dialFrom opens a TCP connection from inside the box's namespace (the
// socket stays in it wherever it is used afterwards).
func dialFrom(t *testing.T, nsPath, addr string) (net.Conn, error) {
	t.Helper()
	var c net.Conn
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		goruntime.LockOSThread()
		orig, _ := netns.Get()
		ns, e := netns.GetFromPath(nsPath)
		if e != nil {
			err = e
			return
		}
		defer ns.Close()
		if err = netns.Set(ns); err != nil {
			return
		}
		c, err = net.DialTimeout("tcp", addr, 3*time.Second)
		if netns.Set(orig) == nil {
			goruntime.UnlockOSThread()
		}
	}()
	<-done
	if c != nil {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	}
	return c, err
}

// get sends one request for host over c and returns status and body.
func get(c net.Conn, br *bufio.Reader, host, path string, hdr map[string]string) (int, string, error) {
	req := "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\n"
	for k, v := range hdr {
		req += k + ": " + v + "\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		return 0, "", err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// boxHTTP makes one plain HTTP request from the box to addr for host.
func boxHTTP(t *testing.T, nsPath, addr, host, path string, hdr map[string]string) (int, string, error) {
	t.Helper()
	c, err := dialFrom(t, nsPath, addr)
	if err != nil {
		return 0, "", err
	}
	defer c.Close()
	return get(c, bufio.NewReader(c), host, path, hdr)
}

// boxHTTPS makes one HTTPS request for / from the box to addr with SNI
// sni ("" for none), trusting roots.
func boxHTTPS(t *testing.T, nsPath, addr, sni string, roots *x509.CertPool, hdr map[string]string) (int, string, error) {
	t.Helper()
	return boxHTTPSPath(t, nsPath, addr, sni, "/", roots, hdr)
}

// boxHTTPSPath is boxHTTPS for path.
func boxHTTPSPath(t *testing.T, nsPath, addr, sni, path string, roots *x509.CertPool, hdr map[string]string) (int, string, error) {
	t.Helper()
	c, err := dialFrom(t, nsPath, addr)
	if err != nil {
		return 0, "", err
	}
	defer c.Close()
	cfg := &tls.Config{ServerName: sni, RootCAs: roots}
	if sni == "" {
		cfg.InsecureSkipVerify = true // no name to verify; the point is what the proxy does
	}
	tc := tls.Client(c, cfg)
	if err := tc.Handshake(); err != nil {
		return 0, "", err
	}
	host := sni
	if host == "" {
		host = strings.Split(addr, ":")[0]
	}
	return get(tc, bufio.NewReader(tc), host, path, hdr)
}

func poolOf(t *testing.T, pems ...[]byte) *x509.CertPool {
	p := x509.NewCertPool()
	for _, b := range pems {
		if !p.AppendCertsFromPEM(b) {
			t.Fatal("bad PEM")
		}
	}
	return p
}

// newEgressManager starts a manager on a network of the test's own; the
// returned pointer is removed at the end (tests may swap in a restarted one).
func newEgressManager(t *testing.T, upstreamCA string) **Manager {
	t.Helper()
	cfg := testConfig(t, startTestDNS(t, egZone))
	cfg.EgressRoots = []string{upstreamCA}
	m, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	cur := &m
	t.Cleanup(func() {
		if err := (*cur).Remove(); err != nil {
			t.Errorf("removing the test network: %v", err)
		}
	})
	if err := m.Cleanup(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	m.Start()
	return cur
}

func TestEgressAllowMode(t *testing.T) {
	testutil.RequiresRoot(t)
	caFile, _ := newEgressInternet(t)
	caPEM, _ := os.ReadFile(caFile)
	upstreamRoots := poolOf(t, caPEM)
	m := *newEgressManager(t, caFile)
	ctx := context.Background()
	pol, err := ParsePolicy("allow", nil, []string{"allowed.test", "*.wild.test"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	att, err := m.Attach(ctx, "sb-allow", pol)
	if err != nil {
		t.Fatal(err)
	}
	ns := att.NetNS

	httpTests := []struct {
		name, addr, host string
		wantCode         int
		wantBody         string // substring
	}{
		{"allowed host", egAllowed + ":80", "allowed.test", 200, "addr=" + egAllowed},
		{"allowed host, any case and port", egAllowed + ":80", "ALLOWED.test:80", 200, "addr=" + egAllowed},
		{"evil Host to the allowed address", egAllowed + ":80", "evil.test", 403, "evil.test"},
		{"wildcard", egWild + ":80", "x.wild.test", 200, "addr=" + egWild},
		{"wildcard does not match its apex", egWild + ":80", "wild.test", 403, "wild.test"},
		// The proxy goes where the name really is, not where the box sent it.
		{"allowed Host to an evil address", egEvil + ":80", "allowed.test", 200, "addr=" + egAllowed},
		{"allowed name resolving to the metadata service", egMetadata + ":80", "meta.wild.test", 403, egMetadata},
		{"allowed name resolving to a private address", egPrivate + ":80", "priv.wild.test", 403, egPrivate},
		{"address literal outside allow_cidrs", egAllowed + ":80", egAllowed, 403, egAllowed},
	}
	for _, tt := range httpTests {
		t.Run("http/"+tt.name, func(t *testing.T) {
			code, body, err := boxHTTP(t, ns, tt.addr, tt.host, "/", nil)
			if err != nil || code != tt.wantCode || !strings.Contains(body, tt.wantBody) {
				t.Errorf("GET Host %s via %s: got %d %q (err %v), want %d with %q", tt.host, tt.addr, code, body, err, tt.wantCode, tt.wantBody)
			}
		})
	}

	t.Run("http/keep-alive switching hosts", func(t *testing.T) {
		c, err := dialFrom(t, ns, egAllowed+":80")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		br := bufio.NewReader(c)
		if code, _, err := get(c, br, "allowed.test", "/", nil); err != nil || code != 200 {
			t.Fatalf("first request: %d %v, want 200", code, err)
		}
		if code, body, err := get(c, br, "evil.test", "/", nil); err == nil && code != 403 {
			t.Errorf("second request for evil.test on the same connection: %d %q, want 403", code, body)
		}
	})

	t.Run("http/upgrade (WebSocket-like) streams both ways", func(t *testing.T) {
		c, err := dialFrom(t, ns, egAllowed+":80")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		br := bufio.NewReader(c)
		_, _ = io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("upgrade: %v %v, want 101", resp, err)
		}
		for _, msg := range []string{"ping\n", "pong\n"} {
			_, _ = io.WriteString(c, msg)
			if got, err := br.ReadString('\n'); got != msg {
				t.Errorf("echo through the upgraded stream: got %q (%v), want %q", got, err, msg)
			}
		}
	})

	t.Run("not HTTP on port 80", func(t *testing.T) {
		c, err := dialFrom(t, ns, egAllowed+":80")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, _ = io.WriteString(c, "\x00\x01hello\r\n\r\n")
		if n, err := c.Read(make([]byte, 64)); err == nil {
			t.Errorf("raw bytes on port 80 got %d bytes back, want the connection closed", n)
		}
	})

	tlsTests := []struct {
		name, addr, sni string
		wantOK          bool
		wantBody        string
	}{
		{"SNI allowed", egAllowed + ":443", "allowed.test", true, "addr=" + egAllowed},
		{"SNI evil to the allowed address", egAllowed + ":443", "evil.test", false, ""},
		{"SNI wildcard", egWild + ":443", "x.wild.test", true, "addr=" + egWild},
		{"SNI allowed to an evil address goes to the real one", egEvil + ":443", "allowed.test", true, "addr=" + egAllowed},
		{"no SNI", egAllowed + ":443", "", false, ""},
		{"SNI resolving to the metadata service", egMetadata + ":443", "meta.wild.test", false, ""},
	}
	for _, tt := range tlsTests {
		t.Run("tls/"+tt.name, func(t *testing.T) {
			code, body, err := boxHTTPS(t, ns, tt.addr, tt.sni, upstreamRoots, nil)
			ok := err == nil && code == 200
			if ok != tt.wantOK || !strings.Contains(body, tt.wantBody) {
				t.Errorf("TLS with SNI %q via %s: got %d %q (err %v), want ok=%v", tt.sni, tt.addr, code, body, err, tt.wantOK)
			}
		})
	}

	t.Run("learned metadata addresses stay blocked on other ports", func(t *testing.T) {
		// The forwarder learns meta.wild.test → 169.254.169.254 for the box;
		// a port the proxy does not see must still be blocked.
		inNetNS(t, ns, func() {
			c, err := net.Dial("udp", net.JoinHostPort(m.Gateway().String(), "53"))
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			if rc, addrs, err := queryA(c, "meta.wild.test"); err != nil || rc != 0 || len(addrs) != 1 {
				t.Errorf("query meta.wild.test: rcode %d %v %v", rc, addrs, err)
			}
		})
		if c, err := dialFrom(t, ns, egMetadata+":8080"); err == nil {
			c.Close()
			t.Error("the box reaches the metadata address on port 8080 after resolving an allowed name to it")
		}
		// x.wild.test is learned too: port 8080 is reachable by address (no name check
		// on ports the proxy does not handle — documented), which shows the above is the rule.
		inNetNS(t, ns, func() {
			c, _ := net.Dial("udp", net.JoinHostPort(m.Gateway().String(), "53"))
			defer c.Close()
			_, _, _ = queryA(c, "x.wild.test")
		})
		if c, err := dialFrom(t, ns, egWild+":8080"); err != nil {
			t.Errorf("the box cannot reach a learned public address on port 8080: %v", err)
		} else {
			c.Close()
		}
	})

	t.Run("switching to public turns the proxy off", func(t *testing.T) {
		if _, err := m.Update(ctx, "sb-allow", Policy{Mode: ModePublic}); err != nil {
			t.Fatal(err)
		}
		// Not proxied: the box talks to the address it chose, whatever Host says.
		if code, body, err := boxHTTP(t, ns, egEvil+":80", "allowed.test", "/", nil); err != nil || code != 200 || !strings.Contains(body, "addr="+egEvil) {
			t.Errorf("public box: got %d %q %v, want the evil address itself", code, body, err)
		}
		if _, err := m.Update(ctx, "sb-allow", pol); err != nil {
			t.Fatal(err)
		}
		if code, _, err := boxHTTP(t, ns, egAllowed+":80", "evil.test", "/", nil); err != nil || code != 403 {
			t.Errorf("back in allow mode: got %d %v, want 403", code, err)
		}
	})
}

func TestEgressDomainSecrets(t *testing.T) {
	testutil.RequiresRoot(t)
	caFile, _ := newEgressInternet(t)
	caPEM, _ := os.ReadFile(caFile)
	cur := newEgressManager(t, caFile)
	m := *cur
	ctx := context.Background()
	const value, optValue = "s3cr3t-VALUE/with+chars", "opt-in-VALUE"
	ph := m.Placeholder("sb-sec", "API_KEY")
	if !strings.HasPrefix(ph, "sbx-secret-api_key-") || strings.Contains(ph, value) {
		t.Fatalf("placeholder %q: want sbx-secret-api_key-<random>", ph)
	}
	if again := m.Placeholder("sb-sec", "API_KEY"); again != ph {
		t.Errorf("placeholder not stable: %q then %q", ph, again)
	}
	optPh := m.Placeholder("sb-sec", "OPT_KEY")
	pol := Policy{Mode: ModePublic, Secrets: []Secret{
		// Default: the Authorization header only.
		{Name: "API_KEY", Placeholder: ph, Value: value, Domains: []string{"api.secret.test", "nocert.test"}},
		// Opted in: X-Key and the query, not Authorization.
		{Name: "OPT_KEY", Placeholder: optPh, Value: optValue, Domains: []string{"api.secret.test"}, Headers: []string{"X-Key"}, AllowQuery: true},
	}}
	att, err := m.Attach(ctx, "sb-sec", pol)
	if err != nil {
		t.Fatal(err)
	}
	ns := att.NetNS
	egressCA := poolOf(t, m.EgressCA())
	// The box puts each placeholder everywhere it can: only what the
	// secret names may come back with the value.
	everywhere := func(p string) (map[string]string, string) {
		return map[string]string{"Authorization": "Bearer " + p, "X-Key": p, "X-Other": p, "Cookie": "s=" + p}, "/v1/" + p + "?key=" + p + "&x=1"
	}
	hdr, path := everywhere(ph)
	optHdr, optPath := everywhere(optPh)

	t.Run("an echoing https host gets the value in Authorization only", func(t *testing.T) {
		code, body, err := boxHTTPSPath(t, ns, egSecret+":443", "api.secret.test", path, egressCA, hdr)
		if err != nil || code != 200 || !strings.Contains(body, "addr="+egSecret) || !strings.Contains(body, "auth=Bearer "+value+"\n") {
			t.Fatalf("got %d %q (err %v), want the value in Authorization at %s", code, body, err, egSecret)
		}
		if n := strings.Count(body, value); n != 1 {
			t.Errorf("the value comes back %d times, want once (Authorization only):\n%s", n, body)
		}
		for _, want := range []string{"key=" + ph + "\n", "query=key=" + ph + "&x=1\n", "hdr X-Other=" + ph + "\n", "hdr Cookie=s=" + ph + "\n", "path=/v1/" + ph + "\n"} {
			if !strings.Contains(body, want) {
				t.Errorf("echo lacks %q (the placeholder left alone):\n%s", want, body)
			}
		}
	})
	t.Run("named headers and the query only when opted in", func(t *testing.T) {
		code, body, err := boxHTTPSPath(t, ns, egSecret+":443", "api.secret.test", optPath, egressCA, optHdr)
		want := []string{"auth=Bearer " + optPh + "\n", "key=" + optValue + "\n", "query=key=" + optValue + "&x=1\n", "hdr X-Other=" + optPh + "\n"}
		for _, w := range want {
			if err != nil || code != 200 || !strings.Contains(body, w) {
				t.Errorf("got %d %q (err %v), want a body with %q", code, body, err, w)
			}
		}
		if n := strings.Count(body, optValue); n != 2 {
			t.Errorf("the opted-in value comes back %d times, want twice (X-Key and query):\n%s", n, body)
		}
	})
	t.Run("plain http to the secret's host is refused, the value never sent", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			hdr  map[string]string
			path string
		}{
			{"header", map[string]string{"Authorization": "Bearer " + ph}, "/"},
			{"basic credentials", map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("u:"+ph))}, "/"},
			{"opted-in query", nil, "/?key=" + optPh},
		} {
			code, body, err := boxHTTP(t, ns, egSecret+":80", "api.secret.test", tc.path, tc.hdr)
			if err != nil || code != http.StatusForbidden || strings.Contains(body, value) || strings.Contains(body, optValue) ||
				!strings.Contains(body, "only sent over HTTPS") || strings.Contains(body, "addr=") {
				t.Errorf("%s: got %d %q (err %v), want the proxy's 403 (HTTPS only), nothing from upstream", tc.name, code, body, err)
			}
		}
		// Without a placeholder plain HTTP to the host works.
		if code, body, err := boxHTTP(t, ns, egSecret+":80", "api.secret.test", "/", nil); err != nil || code != 200 || !strings.Contains(body, "addr="+egSecret) {
			t.Errorf("plain request without a placeholder: got %d %q (err %v), want 200 from %s", code, body, err, egSecret)
		}
	})
	t.Run("https to a secret's host whose certificate does not verify gets nothing", func(t *testing.T) {
		code, body, err := boxHTTPSPath(t, ns, egEvil+":443", "nocert.test", "/", egressCA, hdr)
		if err != nil || code != http.StatusBadGateway || strings.Contains(body, value) || strings.Contains(body, "addr=") {
			t.Errorf("got %d %q (err %v), want the proxy's 502 and nothing sent", code, body, err)
		}
	})
	t.Run("http to another domain keeps the placeholder", func(t *testing.T) {
		code, body, err := boxHTTP(t, ns, egEvil+":80", "other.test", path, hdr)
		if err != nil || code != 200 || strings.Contains(body, value) || !strings.Contains(body, "key="+ph) {
			t.Errorf("got %d %q (err %v), want the placeholder only", code, body, err)
		}
	})
	t.Run("a secret-domain Host sent to an evil address goes to the real host", func(t *testing.T) {
		code, body, err := boxHTTP(t, ns, egEvil+":80", "api.secret.test", "/", nil)
		if err != nil || code != 200 || !strings.Contains(body, "addr="+egSecret) {
			t.Errorf("got %d %q (err %v), want it served by %s", code, body, err, egSecret)
		}
	})
	t.Run("https to another domain is passed through", func(t *testing.T) {
		// Untouched TLS: only the upstream's own CA verifies it.
		code, body, err := boxHTTPS(t, ns, egEvil+":443", "other.test", poolOf(t, caPEM), hdr)
		if err != nil || code != 200 || strings.Contains(body, value) || !strings.Contains(body, "key="+ph) {
			t.Errorf("got %d %q (err %v), want the placeholder, end-to-end TLS", code, body, err)
		}
	})
	t.Run("public mode still blocks private targets through the proxy", func(t *testing.T) {
		code, _, err := boxHTTP(t, ns, egPrivate+":80", "other.test", "/", nil)
		if err == nil && code == 200 {
			t.Errorf("got %d, want the private address blocked", code)
		}
	})
	t.Run("after a restart the proxy substitutes again", func(t *testing.T) {
		m.closeLoops()
		m.fw.close()
		m.lock.release() // the kernel's part when a daemon dies
		m2, err := New(ctx, m.cfg)
		if err != nil {
			t.Fatal(err)
		}
		*cur, m = m2, m2
		if _, err := m.Recover(ctx, "sb-sec", pol.Secrets); err != nil {
			t.Fatal(err)
		}
		if err := m.Cleanup(ctx, map[string]bool{"sb-sec": true}); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(filepath.Join(m.cfg.StateDir, "state.json"))
		if strings.Contains(string(b), value) || !strings.Contains(string(b), `"X-Key"`) {
			t.Errorf("state.json holds the secret's value or lacks its headers:\n%s", b)
		}
		code, body, err := boxHTTPSPath(t, ns, egSecret+":443", "api.secret.test", optPath, egressCA, optHdr)
		if err != nil || code != 200 || !strings.Contains(body, "key="+optValue+"\n") || !strings.Contains(body, "auth=Bearer "+optPh+"\n") {
			t.Errorf("got %d %q (err %v), want the value in X-Key only", code, body, err)
		}
	})
}

// BenchmarkAttachFromPool measures what attaching costs a create when the
// pool has a namespace ready, per policy: the egress proxy adds one set
// element to the same nftables transaction.
func BenchmarkAttachFromPool(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	ctx := context.Background()
	cfg := Config{StateDir: b.TempDir(), Bridge: "sbxtbench", Subnet: "10.214.250.0/24", Table: "sbxtbench",
		DNSUpstreams: []string{"127.0.0.1:53"}, PoolSize: 8}
	m, err := New(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = m.Remove() }()
	if err := m.Cleanup(ctx, nil); err != nil {
		b.Fatal(err)
	}
	m.Start()
	allow, _ := ParsePolicy("allow", nil, []string{"example.com", "*.github.com"}, nil)
	for _, bc := range []struct {
		name string
		pol  Policy
	}{
		{"public", Policy{Mode: ModePublic}},
		{"allow", allow},
		{"public+secrets", Policy{Mode: ModePublic, Secrets: []Secret{{Name: "K", Placeholder: "p", Value: "v", Domains: []string{"a.test"}}}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				for range 200 { // wait for a pooled slot
					m.mu.Lock()
					n := len(m.pool)
					m.mu.Unlock()
					if n > 0 {
						break
					}
					time.Sleep(5 * time.Millisecond)
				}
				id := fmt.Sprintf("sb-%s-%d", bc.name, i)
				b.StartTimer()
				if _, err := m.Attach(ctx, id, bc.pol); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				_ = m.Detach(ctx, id)
				b.StartTimer()
			}
		})
	}
}
