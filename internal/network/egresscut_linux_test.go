package network

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/sbxdev/sbx/internal/testutil"
)

// cutWithin bounds how long a policy change may leave a connection the
// proxy holds open.
const cutWithin = 5 * time.Second

// openTLSStream opens a TLS connection from the box through the proxy
// (spliced: the upstream's own certificate) and makes one request on it,
// so that it is known to be established end to end.
func openTLSStream(t *testing.T, ns, addr, sni string, roots *x509.CertPool) net.Conn {
	t.Helper()
	c, err := dialFrom(t, ns, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Time{})
	tc := tls.Client(c, &tls.Config{ServerName: sni, RootCAs: roots})
	if code, _, err := get(tc, bufio.NewReader(tc), sni, "/", nil); err != nil || code != 200 {
		t.Fatalf("request over the new TLS stream to %s: %d %v, want 200", sni, code, err)
	}
	return tc
}

// waitCut waits (at most cutWithin) for the box's side of c to be closed.
func waitCut(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(cutWithin))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || err == nil {
		t.Errorf("the stream is still open %v after the policy change (read: %v), want it cut", cutWithin, err)
	}
}

// waitUpstreamClosed waits (at most cutWithin) until the server at addr
// has no connection open.
func waitUpstreamClosed(t *testing.T, conns *upstreamConns, addr string) {
	t.Helper()
	deadline := time.Now().Add(cutWithin)
	for conns.open(addr) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := conns.open(addr); n > 0 {
		t.Errorf("%s still has %d connections from the proxy %v after the policy change, want 0", addr, n, cutWithin)
	}
}

func TestEgressPolicyChangeCutsProxiedConnections(t *testing.T) {
	testutil.RequiresRoot(t)
	caFile, conns := newEgressInternet(t)
	caPEM, _ := os.ReadFile(caFile)
	roots := poolOf(t, caPEM)
	m := *newEgressManager(t, caFile)
	ctx := context.Background()
	both, err := ParsePolicy("allow", nil, []string{"allowed.test", "*.wild.test"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	wildOnly, _ := ParsePolicy("allow", nil, []string{"*.wild.test"}, nil)
	attach := func(t *testing.T, id string) string {
		t.Helper()
		att, err := m.Attach(ctx, id, both)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Detach(ctx, id) })
		return att.NetNS
	}
	update := func(t *testing.T, id string, p Policy) {
		t.Helper()
		if _, err := m.Update(ctx, id, p); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("revoking a domain cuts its spliced TLS stream, not the others", func(t *testing.T) {
		ns := attach(t, "sb-revoke")
		revoked := openTLSStream(t, ns, egAllowed+":443", "allowed.test", roots)
		kept := openTLSStream(t, ns, egWild+":443", "x.wild.test", roots)
		update(t, "sb-revoke", wildOnly)
		waitCut(t, revoked)
		waitUpstreamClosed(t, conns, egAllowed+":443")
		if code, _, err := get(kept, bufio.NewReader(kept), "x.wild.test", "/", nil); err != nil || code != 200 {
			t.Errorf("the stream to x.wild.test, still allowed: %d %v, want it kept", code, err)
		}
	})

	t.Run("revoking a domain cuts an upgraded HTTP stream", func(t *testing.T) {
		ns := attach(t, "sb-upgrade")
		c, err := dialFrom(t, ns, egAllowed+":80")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Time{})
		br := bufio.NewReader(c)
		_, _ = io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("upgrade: %v %v, want 101", resp, err)
		}
		_, _ = io.WriteString(c, "ping\n")
		if got, err := br.ReadString('\n'); got != "ping\n" {
			t.Fatalf("echo before the change: %q %v", got, err)
		}
		update(t, "sb-upgrade", wildOnly)
		_ = c.SetReadDeadline(time.Now().Add(cutWithin))
		_, _ = io.WriteString(c, "still there?\n")
		got, err := br.ReadString('\n')
		var ne net.Error
		if err == nil || errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("upgraded stream after revoking its host: read %q, %v; want it cut", got, err)
		}
	})

	t.Run("mode none cuts every stream", func(t *testing.T) {
		ns := attach(t, "sb-none")
		openTLSStream(t, ns, egAllowed+":443", "allowed.test", roots)
		openTLSStream(t, ns, egWild+":443", "x.wild.test", roots)
		update(t, "sb-none", Policy{Mode: ModeNone})
		// The box's veth goes with mode none: look at the upstream side.
		waitUpstreamClosed(t, conns, egAllowed+":443")
		waitUpstreamClosed(t, conns, egWild+":443")
	})

	t.Run("detach cuts every stream", func(t *testing.T) {
		ns := attach(t, "sb-detach")
		openTLSStream(t, ns, egAllowed+":443", "allowed.test", roots)
		if err := m.Detach(ctx, "sb-detach"); err != nil {
			t.Fatal(err)
		}
		waitUpstreamClosed(t, conns, egAllowed+":443")
	})

	t.Run("switching to public with an address in deny_cidrs cuts it", func(t *testing.T) {
		ns := attach(t, "sb-deny")
		c := openTLSStream(t, ns, egAllowed+":443", "allowed.test", roots)
		deny, err := ParsePolicy("public", nil, nil, []string{egAllowed + "/32"})
		if err != nil {
			t.Fatal(err)
		}
		// Public without secrets: new connections no longer go through
		// the proxy, but the one it holds is checked all the same.
		update(t, "sb-deny", deny)
		waitCut(t, c)
		waitUpstreamClosed(t, conns, egAllowed+":443")
	})
}
