package integration

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sbxdev/sbx/internal/tenant"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// testCA makes a CA and a server certificate for 127.0.0.1 signed by it,
// written as PEM files in dir.
func testCA(t *testing.T, dir string) (caFile, certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sbx test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	write := func(name, typ string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pool = x509.NewCertPool()
	pool.AddCert(ca)
	return write("ca.pem", "CERTIFICATE", caDER), write("cert.pem", "CERTIFICATE", der), write("key.pem", "EC PRIVATE KEY", keyDER), pool
}

// TestTenantsEndToEnd runs a daemon with two tenants over TLS with real
// sandboxes: beta cannot list, exec in, read files of, proxy to or attach
// sessions of acme's sandboxes; a box with a scoped token creates a child
// from inside over the gateway endpoint and sees nothing else; the child
// dies with its parent; ownership survives kill -9.
func TestTenantsEndToEnd(t *testing.T) {
	dir := t.TempDir()
	caFile, certFile, keyFile, pool := testCA(t, dir)
	tokA, tokB := tenant.NewToken(), tenant.NewToken()
	tenants := filepath.Join(dir, "tenants.json")
	if err := os.WriteFile(tenants, fmt.Appendf(nil, `{"tenants": [
		{"name": "acme", "tokens": [%q], "quotas": {"max_sandboxes": 6}},
		{"name": "beta", "tokens": [%q], "quotas": {"max_sandboxes": 2}}]}`,
		tenant.HashToken(tokA), tenant.HashToken(tokB)), 0o600); err != nil {
		t.Fatal(err)
	}
	tlsConf := &tls.Config{RootCAs: pool}
	// Networking of its own (the box endpoint is on the gateway), without
	// the shared test internet: nothing here leaves the host.
	tag := randTag()
	var sub byte
	_, _ = fmt.Sscanf(tag[:2], "%02x", &sub)
	bridge, gateway := "sbxt"+tag, fmt.Sprintf("10.216.%d.1", sub)
	t.Cleanup(func() { removeNetworking(bridge, bridge) })
	nd := struct {
		*daemon
		gateway string
	}{startDaemonOpts(t, daemonOpts{token: tokA, tls: tlsConf},
		"--network=true", "--net-bridge", bridge, "--net-table", bridge, "--net-subnet", fmt.Sprintf("10.216.%d.0/24", sub),
		"--dns-upstream", "127.0.0.1:53", "--net-pool", "0",
		"--tenants", tenants, "--tls-cert", certFile, "--tls-key", keyFile), gateway}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	a := nd.client()
	defer a.Close()
	b := sbx.NewClient(nd.url(), sbx.WithToken(tokB), sbx.WithTLS(tlsConf))
	defer b.Close()
	t.Cleanup(func() { // beta's boxes (the harness cleans up acme's)
		list, _ := b.List(context.Background())
		for _, sb := range list {
			_ = sb.Destroy(context.Background())
		}
	})

	// TLS: plain HTTP is refused; the CLI trusts the CA through SBX_CACERT.
	if _, err := sbx.NewClient("http://"+nd.addr, sbx.WithToken(tokA)).Version(ctx); err == nil {
		t.Error("plain HTTP to the TLS listener: got success, want an error")
	}
	if _, err := sbx.NewClient(nd.url(), sbx.WithToken(tokA)).Version(ctx); err == nil {
		t.Error("HTTPS without trusting the test CA: got success, want a verification error")
	}
	cli := exec.Command(nd.bin, "--addr", nd.url(), "version")
	cli.Env = append(os.Environ(), "SBX_TOKEN="+tokA, "SBX_CACERT="+caFile)
	if out, err := cli.CombinedOutput(); err != nil {
		t.Fatalf("sbx version with SBX_CACERT: %v\n%s", err, out)
	}

	// Names are per tenant.
	devA, err := a.Create(ctx, sbx.CreateOptions{Name: "dev"})
	if err != nil {
		t.Fatal(err)
	}
	devB, err := b.Create(ctx, sbx.CreateOptions{Name: "dev"})
	if err != nil {
		t.Fatalf("beta's own \"dev\": %v", err)
	}
	if devA.ID == devB.ID {
		t.Fatal("both tenants' \"dev\" are the same sandbox")
	}
	if res, err := devA.RunShell(ctx, "echo secret > /root/a.txt; (python3 -m http.server 8000 --directory /root >/dev/null 2>&1 &)"); err != nil || res.Code != 0 {
		t.Fatalf("acme's server: %v %+v", err, res)
	}
	if _, err := devA.CreateSession(ctx, sbx.SessionOptions{}); err != nil {
		t.Fatal(err)
	}

	// Beta cannot see, exec in, read, proxy to or attach to acme's box, and
	// each refusal reads as for a missing sandbox.
	list, err := b.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		if sb.ID == devA.ID {
			t.Errorf("beta lists acme's %s", devA.ID)
		}
	}
	const missing = "sb-0000000000ff"
	notFoundAlike := func(what string, op func(ref string) error) {
		t.Helper()
		errMissing, err := op(missing), op(devA.ID)
		var se, sm *sbx.Error
		if !errors.As(err, &se) || !errors.As(errMissing, &sm) || se.Code != connect.CodeNotFound ||
			se.Msg != strings.ReplaceAll(sm.Msg, missing, devA.ID) {
			t.Errorf("beta %s acme's box: got %v, want what a missing one gets (%v)", what, err, errMissing)
		}
	}
	notFoundAlike("exec in", func(ref string) error { _, err := b.Sandbox(ref).RunShell(ctx, "true"); return err })
	notFoundAlike("read a file of", func(ref string) error { _, err := b.Sandbox(ref).ReadFile(ctx, "/root/a.txt"); return err })
	notFoundAlike("open a session in", func(ref string) error {
		_, err := b.Sandbox(ref).CreateSession(ctx, sbx.SessionOptions{})
		return err
	})
	notFoundAlike("list the sessions of", func(ref string) error { _, err := b.Sessions(ctx, ref); return err })
	if ss, err := b.Sessions(ctx, ""); err != nil || len(ss) != 0 {
		t.Errorf("beta's sessions: got %d, %v; want none (acme's is not beta's)", len(ss), err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConf}}
	proxy := func(tok, ref string) (int, string) {
		req, _ := http.NewRequest("GET", nd.url()+"/proxy/"+ref+"/8000/a.txt", nil)
		req.Header.Set("X-Sbx-Token", tok)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	deadline := time.Now().Add(20 * time.Second)
	for code, _ := proxy(tokA, devA.ID); code != 200 && time.Now().Before(deadline); code, _ = proxy(tokA, devA.ID) {
		time.Sleep(100 * time.Millisecond) // python's server is starting
	}
	if code, body := proxy(tokA, devA.ID); code != 200 || body != "secret\n" {
		t.Fatalf("acme through the proxy: got %d %q, want 200 \"secret\\n\"", code, body)
	}
	mc, mb := proxy(tokB, missing)
	if code, body := proxy(tokB, devA.ID); code != http.StatusNotFound || code != mc || body != strings.ReplaceAll(mb, missing, devA.ID) {
		t.Errorf("beta through the proxy to acme's port: got %d %q, want %d %q", code, body, mc, mb)
	}

	// Volumes are per tenant: each has its own "data", and a box sees its
	// tenant's.
	for _, c := range []*sbx.Client{a, b} {
		if _, err := c.CreateVolume(ctx, "data", 16<<20); err != nil {
			t.Fatalf("volume data: %v", err)
		}
		t.Cleanup(func() { _ = c.RemoveVolume(context.Background(), "data") })
	}
	for who, c := range map[string]*sbx.Client{"acme": a, "beta": b} {
		sb, err := c.Create(ctx, sbx.CreateOptions{Volumes: []sbx.VolumeMount{{Volume: "data", Path: "/data"}}})
		if err != nil {
			t.Fatalf("%s's box with its volume: %v", who, err)
		}
		res, err := sb.RunShell(ctx, "cat /data/owner 2>/dev/null; echo "+who+" > /data/owner")
		if err != nil || string(res.Stdout) != "" {
			t.Errorf("%s's fresh volume: got %q, %v; want it empty (not the other tenant's)", who, res.Stdout, err)
		}
		if err := sb.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// A box with a scoped token makes a child from inside, over the
	// gateway endpoint, and sees nothing but its children.
	parent, err := a.Create(ctx, sbx.CreateOptions{ScopedToken: true})
	if err != nil {
		t.Fatal(err)
	}
	api := func(sb *sbx.Sandbox, method, body string) string {
		t.Helper()
		res, err := sb.RunShell(ctx, `curl -sS --max-time 5 -H "Authorization: Bearer $SBX_TOKEN" -H 'Content-Type: application/json' `+
			`-d '`+body+`' "$SBX_ADDR/sbx.v1.SandboxService/`+method+`"`)
		if err != nil {
			t.Fatal(err)
		}
		return string(res.Stdout) + string(res.Stderr)
	}
	if out := api(parent, "GetSandbox", `{"sandbox":"`+devA.ID+`"}`); !strings.Contains(out, `"not_found"`) {
		t.Errorf("scoped token on its parent's sibling: got %s, want not_found", out)
	}
	if out := api(parent, "GetSandbox", `{"sandbox":"`+parent.ID+`"}`); !strings.Contains(out, `"not_found"`) {
		t.Errorf("scoped token on its own box: got %s, want not_found (it manages only its children)", out)
	}
	out := api(parent, "CreateSandbox", `{"name":"kid"}`)
	if !strings.Contains(out, `"parent":"`+parent.ID+`"`) {
		t.Fatalf("create from inside: got %s, want a sandbox whose parent is %s", out, parent.ID)
	}
	// A create from inside never makes the daemon pull: a box must not get
	// it to fetch from registries (here one on the host's loopback).
	reg := startCountingRegistry(t)
	hidden := reg.push(t, "internal/only:1")
	out = api(parent, "CreateSandbox", `{"name":"pull-kid","image":"`+hidden+`"}`)
	if !strings.Contains(out, `"not_found"`) || !strings.Contains(out, "a scoped sandbox token may not pull images") {
		t.Errorf("create of a missing image from inside: got %s, want not_found saying scoped tokens may not pull", out)
	}
	if got := reg.manifestGets("internal/only"); got != 0 {
		t.Errorf("a scoped token's create made the daemon fetch %d manifests from a loopback registry", got)
	}
	if _, err := a.Images().Get(ctx, hidden); !sbx.IsNotFound(err) {
		t.Errorf("acme's store after a scoped token's create of a missing image: %v, want NotFound", err)
	}
	out = api(parent, "ListSandboxes", `{}`)
	if strings.Count(out, `"id":`) != 1 || !strings.Contains(out, `"name":"kid"`) {
		t.Errorf("list from inside: got %s, want its one child", out)
	}
	// Without the token, or with acme's own token, the box endpoint refuses.
	res, err := parent.RunShell(ctx, `curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -d '{}' "$SBX_ADDR/sbx.v1.SandboxService/ListSandboxes"; echo; `+
		`curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer `+tokA+`' -H 'Content-Type: application/json' -d '{}' "$SBX_ADDR/sbx.v1.SandboxService/ListSandboxes"`)
	if err != nil || strings.Fields(string(res.Stdout))[0] != "401" || strings.Fields(string(res.Stdout))[1] != "401" {
		t.Errorf("box endpoint without a scoped token: got %q, %v; want 401 twice", res.Stdout, err)
	}
	// A box without a scoped token cannot reach the endpoint at all, not
	// even with a token stolen from the parent.
	res, err = devA.RunShell(ctx, `curl -s --max-time 2 -o /dev/null -w '%{http_code}' http://`+net.JoinHostPort(nd.gateway, "7779")+`/healthz`)
	if err != nil || string(res.Stdout) != "000" {
		t.Errorf("box without a scoped token to the gateway's API port: got %q, %v; want no connection (000)", res.Stdout, err)
	}
	acmeList := func() []string {
		list, err := a.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, sb := range list {
			ids = append(ids, sb.Name+"/"+sb.Info.GetParent())
		}
		return ids
	}
	// The scoped token is useless outside its box: the main listener refuses it.
	res, err = parent.RunShell(ctx, "printenv SBX_TOKEN")
	if err != nil {
		t.Fatal(err)
	}
	stolen := sbx.NewClient(nd.url(), sbx.WithToken(strings.TrimSpace(string(res.Stdout))), sbx.WithTLS(tlsConf))
	if _, err := stolen.List(ctx); connect.CodeOf(errors.Unwrap(err)) != connect.CodeUnauthenticated && !strings.Contains(fmt.Sprint(err), "unauthenticated") {
		t.Errorf("scoped token on the main listener: got %v, want Unauthenticated", err)
	}
	stolen.Close()
	if got := acmeList(); !slices.Contains(got, "kid/"+parent.ID) {
		t.Errorf("acme's list: got %v, want the child listed with its parent", got)
	}

	// Ownership and parenthood survive kill -9.
	nd.kill9()
	nd.start()
	if got, err := b.Get(ctx, "dev"); err != nil || got.ID != devB.ID {
		t.Errorf("beta's \"dev\" after kill -9: got %v, %v; want %s", got, err, devB.ID)
	}
	if got, err := a.Get(ctx, "dev"); err != nil || got.ID != devA.ID {
		t.Errorf("acme's \"dev\" after kill -9: got %v, %v; want %s", got, err, devA.ID)
	}
	notFoundAlike("exec in (after restart)", func(ref string) error { _, err := b.Sandbox(ref).RunShell(ctx, "true"); return err })
	if out := api(parent, "ListSandboxes", `{}`); !strings.Contains(out, `"name":"kid"`) {
		t.Errorf("scoped token after kill -9: got %s, want its child", out)
	}

	// Beta's boxes go before its token does (the harness cleans up acme's).
	if err := devB.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.RemoveVolume(ctx, "data"); err != nil {
		t.Fatal(err)
	}

	// SIGHUP re-reads the tenants file: beta's token, removed, stops working.
	if err := os.WriteFile(tenants, fmt.Appendf(nil, `{"tenants": [{"name": "acme", "tokens": [%q], "quotas": {"max_sandboxes": 6}}]}`,
		tenant.HashToken(tokA)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := nd.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, err := b.List(ctx)
		var se *sbx.Error
		if errors.As(err, &se) && se.Code == connect.CodeUnauthenticated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("beta after its token left the file and SIGHUP: got %v, want Unauthenticated", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := a.List(ctx); err != nil {
		t.Errorf("acme after the reload: %v", err)
	}

	// Children die with their parent.
	if err := parent.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if got := acmeList(); slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, "kid/") }) {
		t.Errorf("after destroying the parent acme still has %v, want the child gone", got)
	}
}
