package network

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// wireName returns the uncompressed wire form of the name at off in msg
// (length-prefixed labels, the final zero included), following at most 32
// compression pointers: the name as a resolver would see it, decoded
// independently of the forwarder's parser.
func wireName(msg []byte, off int) ([]byte, bool) {
	var out []byte
	for jumps := 0; jumps <= 32; {
		if off >= len(msg) {
			return nil, false
		}
		l := int(msg[off])
		switch {
		case l == 0:
			return append(out, 0), true
		case l&0xC0 == 0xC0:
			if off+1 >= len(msg) {
				return nil, false
			}
			off = int(binary.BigEndian.Uint16(msg[off:]) & 0x3FFF)
			jumps++
		case l&0xC0 != 0:
			return nil, false
		default:
			if off+1+l > len(msg) {
				return nil, false
			}
			out = append(out, msg[off:off+1+l]...)
			off += 1 + l
		}
	}
	return nil, false
}

// FuzzDNSQuery feeds the forwarder what a box sends it. A name the
// forwarder accepts is the one the policy is checked against: it must be
// exactly the name the upstream resolver is asked (the same labels, byte
// for byte), at most 253 characters; the refusal made of any accepted query
// is a response to it, no longer than it or than a header, a 255-byte name
// and a type and class.
func FuzzDNSQuery(f *testing.F) {
	f.Add(mustQuery(f, 1, "a.allowed.test"))
	f.Add(mustQuery(f, 0xffff, "x"))
	f.Add(mustQuery(f, 3, "evil-allowed.test"))
	f.Add(append(mustQuery(f, 1, "a.b")[:12], 0xC0, 12))
	f.Add(append(mustQuery(f, 2, "ab")[:12], 1, 'a', 0xC0, 12, 0, 1, 0, 1))
	f.Fuzz(func(t *testing.T, q []byte) {
		name, ok := questionName(q)
		if !ok {
			return
		}
		if len(name) > 253 {
			t.Fatalf("accepted a %d-character name, more than DNS allows", len(name))
		}
		got, ok := wireName(q, 12)
		if !ok {
			t.Fatalf("accepted %q, which a resolver cannot decode", name)
		}
		want := []byte{0} // the root (a priming query)
		if name != "" {
			q2, err := buildQuery(0, name)
			if err != nil {
				t.Fatalf("accepted %q, which cannot be asked again: %v", name, err)
			}
			want, _ = wireName(q2, 12)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("the policy sees %q (wire %q) but the resolver is asked %q", name, want, got)
		}
		r := errorReply(q, dnsRcodeRefused)
		// The question goes back uncompressed: at most a 255-byte name.
		if len(r) < 12 || len(r) > max(len(q), 12+255+4) {
			t.Fatalf("refusal of %d bytes for a query of %d", len(r), len(q))
		}
		if r[0] != q[0] || r[1] != q[1] || r[2]&0x80 == 0 || r[3]&0x0F != dnsRcodeRefused {
			t.Fatalf("refusal %x is not a REFUSED response to %x", r[:4], q[:4])
		}
		if _, ok := questionName(r); ok {
			t.Fatalf("refusal %x parses as a query", r)
		}
	})
}

// FuzzDNSAnswer feeds the answer walker what an upstream (or whoever
// spoofs it) sends back: it never panics, learns at most one address per
// 14 bytes of answer (the smallest A record), and an answer that the
// walker reads addresses from keeps them when more bytes follow.
func FuzzDNSAnswer(f *testing.F) {
	q := mustQuery(f, 1, "a.test")
	r := append([]byte(nil), q...)
	r[2], r[3] = 0x81, 0x80
	binary.BigEndian.PutUint16(r[6:], 2)
	for _, a := range [][4]byte{{192, 0, 2, 1}, {198, 51, 100, 7}} {
		r = append(r, 0xC0, 12, 0, byte(dnsmessage.TypeA), 0, 1, 0, 0, 0, 60, 0, 4)
		r = append(r, a[:]...)
	}
	f.Add(r)
	f.Add([]byte{0, 0, 0x80, 0, 0, 0, 0, 9, 0, 0, 0, 0})
	f.Add(append(append([]byte(nil), r[:len(r)-5]...), 0xC0, 0xFF))
	f.Fuzz(func(t *testing.T, msg []byte) {
		addrs, ttl := answerA(msg)
		if max := len(msg) / 14; len(addrs) > max {
			t.Fatalf("%d addresses from %d bytes (at most %d)", len(addrs), len(msg), max)
		}
		if ttl < 0 {
			t.Fatalf("negative TTL %v", ttl)
		}
		for _, a := range addrs {
			if !a.Is4() {
				t.Fatalf("learned %v, not an IPv4 address", a)
			}
		}
		more, _ := answerA(append(append([]byte(nil), msg...), 0, 0, 0, 0))
		if len(more) < len(addrs) {
			t.Fatalf("trailing bytes lost addresses: %v, then %v", addrs, more)
		}
	})
}

// TestBuildQueryLabels: buildQuery splits on dots (the seeds above rely on it).
func TestBuildQueryLabels(t *testing.T) {
	q := mustQuery(t, 1, "a.bc.")
	if got, want := q[12:], []byte{1, 'a', 2, 'b', 'c', 0, 0, byte(dnsmessage.TypeA), 0, 1}; !bytes.Equal(got, want) {
		t.Fatalf("got %x, want %x", got, want)
	}
	if name, _ := questionName(q); !strings.EqualFold(name, "a.bc") {
		t.Fatalf("got %q, want a.bc", name)
	}
}

// FuzzDNSBuildQuery feeds the query builder the host names the egress proxy
// resolves for a box (its TLS SNI or HTTP Host header): the query sent
// upstream must ask for exactly the labels of that name, or the builder
// must refuse it.
func FuzzDNSBuildQuery(f *testing.F) {
	f.Add("api.allowed.test")
	f.Add("a.b.")
	f.Add(strings.Repeat("a", 63) + ".test")
	f.Fuzz(func(t *testing.T, name string) {
		q, err := buildQuery(1, name)
		if err != nil {
			return
		}
		got, ok := wireName(q, 12)
		if !ok {
			t.Fatalf("query for %q: name does not decode", name)
		}
		if strings.TrimSuffix(name, ".") == "" {
			t.Fatalf("built a query for the root name from %q", name)
		}
		var want []byte
		for _, l := range strings.Split(strings.TrimSuffix(name, "."), ".") {
			want = append(append(want, byte(len(l))), l...)
		}
		if want = append(want, 0); !bytes.Equal(got, want) {
			t.Fatalf("asked to resolve %q, the query asks for %q", name, got)
		}
		if qn, ok := questionName(q); !ok || qn != strings.TrimSuffix(name, ".") {
			t.Fatalf("query for %q reads back as %q, %v", name, qn, ok)
		}
	})
}

// mustQuery is buildQuery for names the test knows are good.
func mustQuery(tb testing.TB, id uint16, name string) []byte {
	tb.Helper()
	q, err := buildQuery(id, name)
	if err != nil {
		tb.Fatalf("building a query for %q: %v", name, err)
	}
	return q
}
