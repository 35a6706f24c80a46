package image

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// PublicOnly refuses every internal range (IPv4-mapped and NAT64 forms
// too) unless allowed, and admits public addresses.
func TestPublicOnly(t *testing.T) {
	check := PublicOnly([]netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")})
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1", false},
		{"127.1.2.3", false},
		{"::1", false},
		{"::ffff:127.0.0.1", false},
		{"169.254.169.254", false},
		{"fe80::1", false},
		{"10.0.0.1", false},
		{"172.16.5.5", false},
		{"192.168.1.1", false},
		{"100.64.0.1", false},
		{"0.0.0.0", false},
		{"0.1.2.3", false},
		{"fd00::1", false},
		{"64:ff9b::a9fe:a9fe", false}, // 169.254.169.254 through NAT64
		{"224.0.0.1", false},
		{"255.255.255.255", false},
		{"10.9.3.4", true}, // allowed
		{"8.8.8.8", true},
		{"2001:4860:4860::8888", true},
	} {
		err := check(netip.MustParseAddr(tc.addr))
		if tc.ok && err != nil {
			t.Errorf("%s: got %v, want it admitted", tc.addr, err)
		}
		if !tc.ok && !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("%s: got %v, want PermissionDenied", tc.addr, err)
		}
	}
}
