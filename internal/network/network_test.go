package network

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sbxdev/sbx/internal/errdefs"
)

func TestParsePolicy(t *testing.T) {
	tests := []struct {
		name                 string
		mode                 string
		allow, domains, deny []string
		want                 Policy
		wantErr              string // substring naming the bad entry
	}{
		{name: "default is public", want: Policy{Mode: ModePublic}},
		{name: "none", mode: "none", want: Policy{Mode: ModeNone}},
		{name: "public with holes", mode: "public", allow: []string{"10.1.2.3", "192.168.0.0/16"}, deny: []string{"1.2.3.4/8"},
			want: Policy{Mode: ModePublic, AllowCIDRs: []netip.Prefix{pfx("10.1.2.3/32"), pfx("192.168.0.0/16")}, DenyCIDRs: []netip.Prefix{pfx("1.0.0.0/8")}}},
		{name: "allow domains", mode: "allow", domains: []string{"*.Example.COM.", "api.github.com"},
			want: Policy{Mode: ModeAllow, AllowDomains: []string{"*.example.com", "api.github.com"}}},
		{name: "ipv6 deny is a no-op", mode: "allow", deny: []string{"::/0"}, want: Policy{Mode: ModeAllow}},
		{name: "bad cidr", mode: "public", allow: []string{"10.0.0.0/33"}, wantErr: `"10.0.0.0/33"`},
		{name: "bad deny", mode: "public", deny: []string{"nope"}, wantErr: `deny_cidrs entry "nope"`},
		{name: "ipv6 allow", mode: "allow", allow: []string{"2001:db8::/32"}, wantErr: `"2001:db8::/32"`},
		{name: "bad domain", mode: "allow", domains: []string{"a..b"}, wantErr: `"a..b"`},
		{name: "star in the middle", mode: "allow", domains: []string{"a.*.com"}, wantErr: `"a.*.com"`},
		{name: "tld wildcard", mode: "allow", domains: []string{"*.com"}, wantErr: `"*.com"`},
		{name: "none with allow", mode: "none", allow: []string{"1.2.3.4"}, wantErr: "mode none"},
		{name: "none with domains", mode: "none", domains: []string{"a.com"}, wantErr: "mode none"},
		{name: "public with domains", mode: "public", domains: []string{"a.com"}, wantErr: `"a.com"`},
		{name: "bad mode", mode: "open", wantErr: `"open"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePolicy(tt.mode, tt.allow, tt.domains, tt.deny)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("got err %v, want an invalid-argument error mentioning %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); d != "" {
				t.Errorf("policy (-want +got):\n%s", d)
			}
		})
	}
}

func TestMatchDomain(t *testing.T) {
	pats := []string{"*.allowed.test", "exact.test"}
	for name, want := range map[string]bool{
		"a.allowed.test": true, "A.B.Allowed.Test.": true, "allowed.test": false, "xallowed.test": false,
		"exact.test": true, "sub.exact.test": false, "blocked.test": false, "": false,
	} {
		if got := MatchDomain(pats, name); got != want {
			t.Errorf("MatchDomain(%q) = %v, want %v", name, got, want)
		}
	}
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
