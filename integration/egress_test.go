package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// upstreamCA makes a CA and a certificate for the test internet's HTTPS
// servers; the CA goes to the daemon with --egress-ca.
func upstreamCA(t *testing.T, names ...string) (caFile string, cert tls.Certificate) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caT := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "e2e upstream CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caT, caT, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	lt := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, lt, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caFile = filepath.Join(t.TempDir(), "upstream-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		t.Fatal(err)
	}
	return caFile, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// startEgressDaemon is a network daemon whose test internet also serves
// HTTPS (port 443, certificates of a test CA the daemon is told to trust).
// d.tlsConns counts the connections open at each HTTPS server. extraArgs go
// to the daemon.
func startEgressDaemon(t *testing.T, extraArgs ...string) *netDaemon {
	t.Helper()
	caFile, cert := upstreamCA(t, "api.secret.test", "other.test", "a.allowed.test", "public.test")
	d := startNetDaemon(t, append([]string{"--egress-ca", caFile}, extraArgs...)...)
	d.tlsConns = map[string]*atomic.Int32{}
	for _, a := range []string{inetPublic, inetAllowed, inetBlocked} {
		ln := listenIn(t, "/run/netns/"+d.inet.ns, "tcp", a+":443").(net.Listener)
		n := new(atomic.Int32)
		d.tlsConns[a] = n
		srv := &http.Server{Handler: echoHandler(a), ErrorLog: log.New(io.Discard, "", 0), ConnState: func(_ net.Conn, s http.ConnState) {
			switch s {
			case http.StateNew:
				n.Add(1)
			case http.StateClosed, http.StateHijacked:
				n.Add(-1)
			}
		}}
		go func() { _ = srv.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}})) }()
		t.Cleanup(func() { srv.Close() })
	}
	return d
}

// waitTLSConns waits up to within for the HTTPS server at addr to have
// want connections open.
func (d *netDaemon) waitTLSConns(t *testing.T, addr string, want int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for int(d.tlsConns[addr].Load()) != want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := int(d.tlsConns[addr].Load()); got != want {
		t.Fatalf("HTTPS server %s has %d connections open after %v, want %d", addr, got, within, want)
	}
}

func TestEgressDomainSecretsE2E(t *testing.T) {
	d := startEgressDaemon(t)
	ctx := ctxT(t, 5*time.Minute)
	const value = "sk-live-e2e-Value"
	sb, err := d.client().Create(ctx, sbx.CreateOptions{DomainSecrets: []sbx.DomainSecret{
		{Name: "API_KEY", Value: value, Domains: []string{"api.secret.test"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)

	ph := mustRun(t, ctx, sb, `printf %s "$API_KEY"`)
	if !strings.HasPrefix(ph, "sbx-secret-api_key-") || strings.Contains(ph, value) {
		t.Fatalf("$API_KEY in the box = %q, want a placeholder", ph)
	}
	if env := mustRun(t, ctx, sb, "env"); strings.Contains(env, value) || !strings.Contains(env, "SSL_CERT_FILE=/etc/sbx/ca-bundle.crt") {
		t.Errorf("env of the box shows the value or lacks the CA bundle:\n%s", env)
	}
	// The bundle is the root of a tmpfs of its own: a bind of a directory
	// would show the daemon's data dir in the box's mountinfo.
	if mi := mustRun(t, ctx, sb, "cat /proc/self/mountinfo"); strings.Contains(mi, d.dataDir) || strings.Contains(mi, sb.ID) {
		t.Errorf("mountinfo of a box with domain secrets shows the data dir or its id:\n%s", mi)
	}

	t.Run("api never returns the value", func(t *testing.T) {
		got, err := d.client().Get(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		ds := got.Info.GetDomainSecrets()
		if len(ds) != 1 || ds[0].GetName() != "API_KEY" || ds[0].GetValue() != "" || ds[0].GetDomains()[0] != "api.secret.test" {
			t.Errorf("domain_secrets = %v, want API_KEY for api.secret.test without value", ds)
		}
		b, _ := protojson.Marshal(got.Info)
		out, _, code := d.cli("", "inspect", sb.ID)
		if strings.Contains(string(b), value) || strings.Contains(out, value) || code != 0 || !strings.Contains(out, "api.secret.test") {
			t.Errorf("GetSandbox or inspect shows the value, or inspect lacks the domain (exit %d):\n%s", code, out)
		}
	})

	// The box puts the placeholder in Authorization, X-Api-Key and the
	// query; the servers echo all of it back.
	curl := func(sb *sbx.Sandbox, env, url string, extra ...string) string {
		t.Helper()
		res, err := sb.RunShell(ctx, `curl -sS --max-time 5 `+strings.Join(extra, " ")+` -H "Authorization: Bearer $`+env+`" -H "X-Api-Key: $`+env+`" "`+url+`?key=$`+env+`"`)
		if err != nil {
			t.Fatal(err)
		}
		return string(res.Stdout) + string(res.Stderr)
	}
	// check wants a reply from the server at from that saw auth in
	// Authorization, key in X-Api-Key and query in the query string.
	check := func(t *testing.T, out, from, auth, key, query string) {
		t.Helper()
		want := "hello from " + from + "\n"
		if !strings.HasPrefix(out, want) || !strings.Contains(out, "\nauth=Bearer "+auth+"\nquery=key="+query+"\n") ||
			!strings.Contains(out, "\nhdr X-Api-Key="+key+"\n") {
			t.Errorf("got %q, want a reply from %s that saw Authorization %q, X-Api-Key %q, query %q", out, from, auth, key, query)
		}
	}
	t.Run("https: an echoing host gets the value in Authorization only", func(t *testing.T) {
		// Intercepted: curl trusts the egress CA through CURL_CA_BUNDLE.
		out := curl(sb, "API_KEY", "https://api.secret.test/")
		check(t, out, inetPublic, value, ph, ph)
		if n := strings.Count(out, value); n != 1 {
			t.Errorf("the value comes back %d times, want once (Authorization):\n%s", n, out)
		}
	})
	t.Run("plain http to the secret's host is refused", func(t *testing.T) {
		out := curl(sb, "API_KEY", "http://api.secret.test/")
		if strings.Contains(out, value) || strings.Contains(out, "hello from") || !strings.Contains(out, "only sent over HTTPS") {
			t.Errorf("got %q, want the proxy's refusal (HTTPS only) and nothing from the server", out)
		}
		check(t, curl(sb, "API_KEY", "http://other.test/"), inetBlocked, ph, ph, ph)
	})
	t.Run("https to another host is not intercepted", func(t *testing.T) {
		// Passed through: the server's own certificate, which the box does
		// not trust (only the daemon does): -k to see what it was sent.
		if out := curl(sb, "API_KEY", "https://other.test/"); !strings.Contains(out, "certificate") {
			t.Errorf("other.test over TLS: got %q, want curl to reject the upstream's own certificate (no interception)", out)
		}
		check(t, curl(sb, "API_KEY", "https://other.test/", "-k"), inetBlocked, ph, ph, ph)
	})
	t.Run("python trusts the bundle", func(t *testing.T) {
		out := mustRun(t, ctx, sb, `/usr/bin/python3 -c 'import os,urllib.request as u; k=os.environ["API_KEY"]; r=u.Request("https://api.secret.test/?key="+k, headers={"Authorization": "Bearer "+k, "X-Api-Key": k}); print(u.urlopen(r, timeout=5).read().decode())'`)
		check(t, out, inetPublic, value, ph, ph)
	})
	t.Run("cli: named header and the query, opted in", func(t *testing.T) {
		const optValue = "sk-opt-in-e2e"
		id, errOut, code := d.cli("", "create", "--secret-for", "OPT_KEY="+optValue+"@api.secret.test;header=X-Api-Key;query")
		id = strings.TrimSpace(id)
		if code != 0 {
			t.Fatalf("sbx create --secret-for with options: exit %d: %s", code, errOut)
		}
		d.remember(id)
		opt, err := d.client().Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		ds := opt.Info.GetDomainSecrets()
		if len(ds) != 1 || len(ds[0].GetHeaders()) != 1 || ds[0].GetHeaders()[0] != "X-Api-Key" || !ds[0].GetAllowQuery() || ds[0].GetValue() != "" {
			t.Errorf("domain_secrets = %v, want OPT_KEY with header X-Api-Key and the query, no value", ds)
		}
		optPh := mustRun(t, ctx, opt, `printf %s "$OPT_KEY"`)
		out := curl(opt, "OPT_KEY", "https://api.secret.test/")
		check(t, out, inetPublic, optPh, optValue, optValue)
		if n := strings.Count(out, optValue); n != 2 {
			t.Errorf("the value comes back %d times, want twice (X-Api-Key and query):\n%s", n, out)
		}
	})
	t.Run("after a daemon crash", func(t *testing.T) {
		d.kill9()
		d.start()
		if sb, err = d.client().Get(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		check(t, curl(sb, "API_KEY", "https://api.secret.test/"), inetPublic, value, ph, ph)
	})
}

func TestEgressAllowModeE2E(t *testing.T) {
	d := startEgressDaemon(t)
	ctx := ctxT(t, 5*time.Minute)
	sb := createNet(t, ctx, d, &sbx.NetworkPolicy{Mode: "allow", AllowDomains: []string{"*.allowed.test"}})
	code := func(args string) string {
		t.Helper()
		res, err := sb.RunShell(ctx, "curl -s --max-time 5 -o /dev/null -w %{http_code} "+args)
		if err != nil {
			t.Fatal(err)
		}
		return string(res.Stdout)
	}
	for _, tt := range []struct{ name, args, want string }{
		{"allowed name", "http://a.allowed.test/", "200"},
		{"Host of another name to the allowed address", "-H 'Host: blocked.test' http://" + inetAllowed + "/", "403"},
		{"SNI of another name to the allowed address", "-k --resolve blocked.test:443:" + inetAllowed + " https://blocked.test/", "000"},
		{"allowed SNI", "-k https://a.allowed.test/", "200"},
		{"allowed name resolving to the metadata address", "http://meta.allowed.test/", "403"},
		// Matches *.allowed.test as a string, but its empty label ends the
		// name on the wire: the proxy once asked DNS for blocked.test
		// (with the rest of the name read as the query's type and class:
		// 502 here; a crafted label with NUL bytes made it a clean query
		// for another name, see internal/network's
		// TestRouteResolvesWhatItChecks). Now it is refused by policy.
		{"Host with an empty label", "-H 'Host: blocked.test..allowed.test' http://" + inetAllowed + "/", "403"},
		{"Host with an over-long label", "-H 'Host: x." + strings.Repeat("a", 64) + ".allowed.test' http://" + inetAllowed + "/", "403"},
	} {
		if got := code(tt.args); got != tt.want {
			t.Errorf("%s: curl %s: got %s, want %s", tt.name, tt.args, got, tt.want)
		}
	}
}

// holdTLS is a box's main process: it opens a TLS connection to
// a.allowed.test:443 (through the egress proxy, spliced), sends nothing and
// waits; the test watches the connection from the server's side.
const holdTLS = `import socket, ssl, time
while True:
    try:
        s = socket.create_connection(("a.allowed.test", 443), timeout=5)
        break
    except OSError:
        time.sleep(0.2)
c = ssl._create_unverified_context().wrap_socket(s, server_hostname="a.allowed.test")
c.settimeout(None)
try:
    c.recv(1)
except OSError:
    pass
time.sleep(3600)
`

// TestEgressPolicyChangeCutsStreamsE2E: a TLS stream the egress proxy
// splices is cut when its domain is revoked, when the box goes to mode
// none and when it is destroyed, as nftables cuts direct connections.
func TestEgressPolicyChangeCutsStreamsE2E(t *testing.T) {
	d := startEgressDaemon(t)
	ctx := ctxT(t, 5*time.Minute)
	const cutWithin = 5 * time.Second
	pol := &sbx.NetworkPolicy{Mode: "allow", AllowDomains: []string{"*.allowed.test", "public.test"}}
	for _, tt := range []struct {
		name   string
		change func(sb *sbx.Sandbox) error
	}{
		{"domain revoked", func(sb *sbx.Sandbox) error {
			return sb.UpdateNetwork(ctx, sbx.NetworkPolicy{Mode: "allow", AllowDomains: []string{"public.test"}})
		}},
		{"mode none", func(sb *sbx.Sandbox) error {
			_, _, code := d.cli("", "network", sb.ID, "--mode", "none")
			if code != 0 {
				return errors.New("sbx network --mode none failed")
			}
			return nil
		}},
		{"destroyed", func(sb *sbx.Sandbox) error { return sb.Destroy(ctx) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sb := createNet(t, ctx, d, pol, "python3", "-c", holdTLS)
			d.waitTLSConns(t, inetAllowed, 1, 60*time.Second)
			if err := tt.change(sb); err != nil {
				t.Fatal(err)
			}
			d.waitTLSConns(t, inetAllowed, 0, cutWithin)
		})
	}
}
