package network

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestSubstitute(t *testing.T) {
	const ph, val = "sbx-secret-k-0123", "v&al=ue+1"
	basic := func(s string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(s)) }
	request := func() *http.Request {
		return &http.Request{
			Header: http.Header{
				"Authorization": {"Bearer " + ph},
				"X-Api-Key":     {ph},
				"X-Other":       {"prefix-" + ph + "-suffix"},
				"X-Untouched":   {"nothing"},
			},
			URL: &url.URL{Path: "/p/" + ph, RawQuery: "key=" + ph + "&a=1"},
		}
	}
	tests := []struct {
		name      string
		secret    Secret
		auth      string // Authorization wanted ("" means Bearer + value)
		wantHdr   map[string]string
		wantQuery string
	}{
		{
			name:   "default: Authorization only",
			secret: Secret{Placeholder: ph, Value: val},
			wantHdr: map[string]string{"Authorization": "Bearer " + val, "X-Api-Key": ph, "X-Other": "prefix-" + ph + "-suffix",
				"X-Untouched": "nothing"},
			wantQuery: "key=" + ph + "&a=1",
		},
		{
			name:      "default: inside Basic credentials",
			secret:    Secret{Placeholder: ph, Value: val},
			auth:      basic("user:" + ph),
			wantHdr:   map[string]string{"Authorization": basic("user:" + val), "X-Api-Key": ph},
			wantQuery: "key=" + ph + "&a=1",
		},
		{
			name:      "named headers, not Authorization",
			secret:    Secret{Placeholder: ph, Value: val, Headers: []string{"X-Api-Key", "X-Other"}},
			wantHdr:   map[string]string{"Authorization": "Bearer " + ph, "X-Api-Key": val, "X-Other": "prefix-" + val + "-suffix"},
			wantQuery: "key=" + ph + "&a=1",
		},
		{
			name:      "query opted in, escaped",
			secret:    Secret{Placeholder: ph, Value: val, AllowQuery: true},
			wantHdr:   map[string]string{"Authorization": "Bearer " + val, "X-Api-Key": ph},
			wantQuery: "key=v%26al%3Due%2B1&a=1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := request()
			if tt.auth != "" {
				r.Header.Set("Authorization", tt.auth)
			}
			substitute(r, tt.secret)
			for k, want := range tt.wantHdr {
				if got := r.Header.Get(k); got != want {
					t.Errorf("header %s: got %q, want %q", k, got, want)
				}
			}
			if got := r.URL.RawQuery; got != tt.wantQuery {
				t.Errorf("query: got %q, want %q", got, tt.wantQuery)
			}
			if tt.secret.AllowQuery {
				if q, _ := url.ParseQuery(r.URL.RawQuery); q.Get("key") != val {
					t.Errorf("query decodes to %q, want %q", q.Get("key"), val)
				}
			}
			if r.URL.Path != "/p/"+ph {
				t.Errorf("path: got %q, want the placeholder left alone", r.URL.Path)
			}
		})
	}
}

func TestCarries(t *testing.T) {
	const ph = "sbx-secret-k-0123"
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("u:"+ph))
	for _, tc := range []struct {
		name string
		hdr  http.Header
		url  string
		want bool
	}{
		{"nothing", http.Header{"X": {"y"}}, "/?a=b", false},
		{"a header", http.Header{"X-Api-Key": {ph}}, "/", true},
		{"basic credentials", http.Header{"Authorization": {basic}}, "/", true},
		{"the query", nil, "/?k=" + ph, true},
		{"the path", nil, "/" + ph, true},
	} {
		u, _ := url.Parse(tc.url)
		if got := carries(&http.Request{Header: tc.hdr, URL: u}, ph); got != tc.want {
			t.Errorf("%s: carries = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestLooksLikeHTTP(t *testing.T) {
	for in, want := range map[string]bool{
		"GET / HTTP/1.1\r\n": true, "POST /x HTTP/1.1": true, "OPTIONS * HTTP/1.1": true,
		"\x16\x03\x01": false, "get / HTTP/1.1": false, "SSH-2.0-OpenSSH": false, "PRI * HTTP/2.0": true, "": false,
	} {
		if got := looksLikeHTTP(bufio.NewReader(strings.NewReader(in))); got != want {
			t.Errorf("looksLikeHTTP(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestReadClientHello(t *testing.T) {
	for _, sni := range []string{"api.example.com", ""} {
		a, b := net.Pipe()
		go func() {
			c := tls.Client(a, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
			_ = c.Handshake()
			a.Close()
		}()
		_ = b.SetDeadline(time.Now().Add(5 * time.Second))
		got, hello, err := readClientHello(b)
		if err != nil || got != sni || len(hello) == 0 || hello[0] != 0x16 {
			t.Errorf("SNI %q: got %q, %d bytes starting %x, err %v", sni, got, len(hello), hello[:min(1, len(hello))], err)
		}
		b.Close()
	}
	if _, _, err := readClientHello(strings.NewReader("GET / HTTP/1.1\r\n\r\n")); err == nil {
		t.Error("HTTP read as a ClientHello")
	}
}

func TestRoute(t *testing.T) {
	zone := map[string][]netip.Addr{
		"allowed.test":    {netip.MustParseAddr("198.51.100.1")},
		"x.wild.test":     {netip.MustParseAddr("198.51.100.2")},
		"meta.wild.test":  {netip.MustParseAddr("169.254.169.254")},
		"priv.wild.test":  {netip.MustParseAddr("10.0.0.5")},
		"api.secret.test": {netip.MustParseAddr("198.51.100.3")},
	}
	p := &egressProxy{subnet: netip.MustParsePrefix("10.213.0.0/16"), dialTimeout: time.Second,
		localAddr: func(a netip.Addr) bool {
			return a == netip.MustParseAddr("10.213.0.1") || a == netip.MustParseAddr("192.0.2.77")
		},
		resolve: func(_ context.Context, h string) ([]netip.Addr, error) {
			if a, ok := zone[h]; ok {
				return a, nil
			}
			return nil, errors.New("NXDOMAIN")
		}}
	allow := Policy{Mode: ModeAllow, AllowDomains: []string{"allowed.test", "*.wild.test"},
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}}
	public := Policy{Mode: ModePublic, Secrets: []Secret{{Name: "K", Domains: []string{"api.secret.test"}}}}
	evil := netip.MustParseAddrPort("198.51.100.66:443")
	gwAllowed := Policy{Mode: ModeAllow, AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("10.213.0.1/32")}}
	everything := Policy{Mode: ModeAllow, AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}
	publicAll := Policy{Mode: ModePublic, AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")},
		Secrets: []Secret{{Name: "K", Domains: []string{"api.secret.test"}}}}
	tenSlash8 := Policy{Mode: ModeAllow, AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	tests := []struct {
		name string
		pol  Policy
		orig netip.AddrPort
		host string
		want string // target, or "blocked"
	}{
		{"allowed name goes to its real address", allow, evil, "allowed.test", "198.51.100.1:443"},
		{"trailing dot and case", allow, evil, "Allowed.Test.", "198.51.100.1:443"},
		{"name not allowed", allow, evil, "evil.test", "blocked"},
		{"wildcard", allow, evil, "x.wild.test", "198.51.100.2:443"},
		{"wildcard apex", allow, evil, "wild.test", "blocked"},
		{"allowed name at the metadata address", allow, evil, "meta.wild.test", "blocked"},
		{"allowed name at a private address", allow, evil, "priv.wild.test", "blocked"},
		{"no name outside allow_cidrs", allow, evil, "", "blocked"},
		{"no name inside allow_cidrs", allow, netip.MustParseAddrPort("203.0.113.9:443"), "", "203.0.113.9:443"},
		{"literal inside allow_cidrs", allow, evil, "203.0.113.9", "203.0.113.9:443"},
		{"literal outside allow_cidrs", allow, evil, "198.51.100.1", "blocked"},
		{"public: other names go where the box sent them", public, evil, "whatever.test", "198.51.100.66:443"},
		{"public: secret hosts are resolved", public, evil, "api.secret.test", "198.51.100.3:443"},
		{"public: no name to a public address", public, evil, "", "198.51.100.66:443"},
		{"public: private destination", public, netip.MustParseAddrPort("192.168.1.1:80"), "x.test", "blocked"},
		{"public: metadata destination", public, netip.MustParseAddrPort("169.254.169.254:80"), "", "blocked"},
		{"public: the sandbox subnet", public, netip.MustParseAddrPort("10.213.0.9:80"), "", "blocked"},
		{"public: loopback", public, netip.MustParseAddrPort("127.0.0.1:80"), "", "blocked"},
		{"public: the gateway", public, netip.MustParseAddrPort("10.213.0.1:80"), "", "blocked"},
		// allow_cidrs never open the host: the gateway and its other addresses.
		{"allow: the gateway inside allow_cidrs", gwAllowed, netip.MustParseAddrPort("10.213.0.1:80"), "", "blocked"},
		{"allow: the gateway by literal inside allow_cidrs", gwAllowed, netip.MustParseAddrPort("10.213.0.1:443"), "10.213.0.1", "blocked"},
		{"allow 10/8: the gateway", tenSlash8, netip.MustParseAddrPort("10.213.0.1:80"), "", "blocked"},
		{"allow 0/0: the gateway", everything, netip.MustParseAddrPort("10.213.0.1:80"), "", "blocked"},
		{"allow 0/0: another host address", everything, netip.MustParseAddrPort("192.0.2.77:80"), "", "blocked"},
		{"allow 0/0: a private address elsewhere", everything, netip.MustParseAddrPort("10.79.0.10:80"), "", "10.79.0.10:80"},
		{"public 0/0: the gateway", publicAll, netip.MustParseAddrPort("10.213.0.1:80"), "", "blocked"},
		{"public 0/0: another host address", publicAll, netip.MustParseAddrPort("192.0.2.77:443"), "", "blocked"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cc := &clientConn{orig: tt.orig, box: egressBox{owner: "sb", policy: tt.pol}}
			got, err := p.route(cc, tt.host)
			var b errBlocked
			switch {
			case tt.want == "blocked" && !errors.As(err, &b):
				t.Errorf("route(%q) = %v, %v; want blocked", tt.host, got, err)
			case tt.want != "blocked" && (err != nil || got.String() != tt.want):
				t.Errorf("route(%q) = %v, %v; want %s", tt.host, got, err, tt.want)
			}
		})
	}
}

// TestRouteResolvesWhatItChecks: the proxy resolves a box's host name with
// a real DNS query; a name that passes the allowlist as a string must not
// be sent upstream as another name (an empty label ends a name on the
// wire; a label of 192+ bytes has a length byte that reads as a
// compression pointer). Before the names were checked, both reached the
// address of evil.test.
func TestRouteResolvesWhatItChecks(t *testing.T) {
	zone := map[string][]netip.Addr{
		"evil.test":        {netip.MustParseAddr("198.51.100.66")},
		"api.allowed.test": {netip.MustParseAddr("198.51.100.1")},
	}
	upstream := startTestDNS(t, zone)
	fwd, err := startDNS("127.0.0.1:0", []string{upstream}, dnsClient{}, Limits{}, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer fwd.close()
	p := &egressProxy{subnet: netip.MustParsePrefix("10.213.0.0/16"), dialTimeout: time.Second,
		localAddr: func(netip.Addr) bool { return false },
		resolve:   func(_ context.Context, h string) ([]netip.Addr, error) { return fwd.resolveA(h) }}
	pol := Policy{Mode: ModeAllow, AllowDomains: []string{"*.allowed.test"}}
	// A 192-byte label: its length byte 0xC0 and first byte '0' read as a
	// pointer to offset 48, where the label holds "\x04evil\x04test\x00";
	// its next bytes are the question's type and class (A, IN).
	long := []byte("0\x00\x01\x00\x01" + strings.Repeat("x", 187))
	copy(long[35:], "\x04evil\x04test\x00")
	tests := []struct {
		host, want string
	}{
		{"api.allowed.test", "198.51.100.1:443"},
		{"evil.test..allowed.test", "blocked"},
		{"evil.test.", "blocked"},
		{string(long) + ".allowed.test", "blocked"},
		{"x." + strings.Repeat("a", 64) + ".allowed.test", "blocked"},
	}
	for _, tt := range tests {
		cc := &clientConn{orig: netip.MustParseAddrPort("198.51.100.99:443"), box: egressBox{owner: "sb", policy: pol}}
		got, err := p.route(cc, tt.host)
		var b errBlocked
		switch {
		case tt.want == "blocked" && !errors.As(err, &b):
			t.Errorf("route(%.40q) = %v, %v; want blocked", tt.host, got, err)
		case tt.want != "blocked" && (err != nil || got.String() != tt.want):
			t.Errorf("route(%.40q) = %v, %v; want %s", tt.host, got, err, tt.want)
		}
	}
}
