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
// d.tlsConns counts the connections open at each HTTPS server.
func startEgressDaemon(t *testing.T) *netDaemon {
	t.Helper()
	caFile, cert := upstreamCA(t, "api.secret.test", "other.test", "a.allowed.test", "public.test")
	d := startNetDaemon(t, "--egress-ca", caFile)
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

	curl := func(url string, extra ...string) string {
		t.Helper()
		res, err := sb.RunShell(ctx, `curl -sS --max-time 5 `+strings.Join(extra, " ")+` -H "Authorization: Bearer $API_KEY" "`+url+`?key=$API_KEY"`)
		if err != nil {
			t.Fatal(err)
		}
		return string(res.Stdout) + string(res.Stderr)
	}
	check := func(t *testing.T, out, from, cred string) {
		t.Helper()
		if want := "hello from " + from + "\n"; !strings.HasPrefix(out, want) || !strings.Contains(out, "auth=Bearer "+cred+"\nquery=key="+cred+"\n") {
			t.Errorf("got %q, want a reply from %s that saw %q", out, from, cred)
		}
	}
	t.Run("http", func(t *testing.T) {
		check(t, curl("http://api.secret.test/"), inetPublic, value)
		check(t, curl("http://other.test/"), inetBlocked, ph)
	})
	t.Run("https", func(t *testing.T) {
		// Intercepted: curl trusts the egress CA through CURL_CA_BUNDLE.
		check(t, curl("https://api.secret.test/"), inetPublic, value)
		// Passed through: the server's own certificate, which the box does
		// not trust (only the daemon does): -k to see what it was sent.
		if out := curl("https://other.test/"); !strings.Contains(out, "certificate") {
			t.Errorf("other.test over TLS: got %q, want curl to reject the upstream's own certificate (no interception)", out)
		}
		check(t, curl("https://other.test/", "-k"), inetBlocked, ph)
	})
	t.Run("python trusts the bundle", func(t *testing.T) {
		out := mustRun(t, ctx, sb, `/usr/bin/python3 -c 'import os,urllib.request as u; r=u.Request("https://api.secret.test/?key="+os.environ["API_KEY"], headers={"Authorization": "Bearer "+os.environ["API_KEY"]}); print(u.urlopen(r, timeout=5).read().decode())'`)
		check(t, out, inetPublic, value)
	})
	t.Run("after a daemon crash", func(t *testing.T) {
		d.kill9()
		d.start()
		if sb, err = d.client().Get(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		check(t, curl("https://api.secret.test/"), inetPublic, value)
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
