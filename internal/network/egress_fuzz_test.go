package network

import (
	"bytes"
	"net/url"
	"strings"
	"testing"
)

// FuzzMatchDomain: a name the allowlist lets through is one a DNS query
// can ask for, and that query asks for labels ending in the pattern's.
func FuzzMatchDomain(f *testing.F) {
	f.Add("*.allowed.test", "api.allowed.test")
	f.Add("allowed.test", "Allowed.Test.")
	f.Add("*.allowed.test", "evil.test..allowed.test")
	f.Fuzz(func(t *testing.T, pattern, name string) {
		pat, err := NormalizeDomain(pattern)
		if err != nil || !MatchDomain([]string{pat}, name) {
			return
		}
		q, err := buildQuery(1, name)
		if err != nil {
			t.Fatalf("%q matches %q but cannot be resolved: %v", name, pat, err)
		}
		wire, ok := wireName(q, 12)
		if !ok {
			t.Fatalf("query for %q does not decode", name)
		}
		var suffix []byte
		for _, l := range strings.Split(strings.TrimPrefix(pat, "*."), ".") {
			suffix = append(append(suffix, byte(len(l))), l...)
		}
		if !bytes.HasSuffix(bytes.ToLower(wire), append(suffix, 0)) {
			t.Fatalf("%q matches %q but the resolver is asked %q", name, pat, wire)
		}
	})
}

// FuzzReadClientHello feeds the proxy's SNI reader what a box sends on a
// TLS connection: it returns at most a handshake's worth of bytes, exactly
// the bytes it consumed, and a name only with them.
func FuzzReadClientHello(f *testing.F) {
	f.Add([]byte("\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00"))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		sni, hello, err := readClientHello(bytes.NewReader(in))
		if err != nil {
			if sni != "" || hello != nil {
				t.Fatalf("error %v with name %q and %d bytes", err, sni, len(hello))
			}
			return
		}
		if !bytes.HasPrefix(in, hello) {
			t.Fatalf("returned %d bytes that are not what was read", len(hello))
		}
		// A ClientHello is at most 64 KiB, in records of at most 16 KiB + 5.
		if len(hello) > 65536+5*5+5 {
			t.Fatalf("read %d bytes for one ClientHello", len(hello))
		}
	})
}

// FuzzURLQueryEscape: a secret substituted into a query string stays one
// value of the parameter it was put in.
func FuzzURLQueryEscape(f *testing.F) {
	f.Add("v&al=ue+1")
	f.Add("a;b=c")
	f.Add("100%#frag")
	f.Fuzz(func(t *testing.T, v string) {
		q, err := url.ParseQuery("key=" + urlQueryEscape(v) + "&other=1")
		if err != nil {
			t.Fatalf("query with %q does not parse: %v", v, err)
		}
		if len(q) != 2 || len(q["key"]) != 1 || q.Get("key") != v || q.Get("other") != "1" {
			t.Fatalf("value %q came back as %v", v, q)
		}
	})
}
