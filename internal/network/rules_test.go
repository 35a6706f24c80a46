package network

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestBaseRules(t *testing.T) {
	p := ruleParams{bridge: "sbx0", subnet: pfx("10.213.0.0/16"), gateway: netip.MustParseAddr("10.213.0.1")}
	blocked := []string{"ip daddr 0.0.0.0/8 drop", "ip daddr 10.0.0.0/8 drop", "ip daddr 100.64.0.0/10 drop",
		"ip daddr 127.0.0.0/8 drop", "ip daddr 169.254.0.0/16 drop", "ip daddr 172.16.0.0/12 drop",
		"ip daddr 192.0.0.0/24 drop", "ip daddr 192.168.0.0/16 drop", "ip daddr 198.18.0.0/15 drop",
		"ip daddr 224.0.0.0/4 drop", "ip daddr 240.0.0.0/4 drop"}
	common := map[string][]string{
		"forward":     {"iifname sbx0 jump from_box", "oifname sbx0 jump to_box"},
		"to_box":      {"ct state established,related accept", "drop"},
		"postrouting": {"oifname != sbx0 ip saddr 10.213.0.0/16 masquerade"},
		"blocked":     blocked,
	}
	inputHead := []string{"iifname != sbx0 return", "meta nfproto ipv6 drop", "ct state established,related accept",
		"ip saddr != @boxes drop",
		// The host: DNS on the gateway for every box, nothing else unless below.
		"ip daddr 10.213.0.1/32 udp dport 53 accept", "ip daddr 10.213.0.1/32 tcp dport 53 accept"}
	fromBoxHead := []string{"meta nfproto ipv6 drop", "ip saddr != @boxes drop",
		"ip saddr . ip daddr @deny drop", "ip daddr 10.213.0.0/16 drop", "ip daddr 127.0.0.0/8 drop",
		"ip saddr . ip daddr @allow accept"}
	fromBoxTail := []string{"jump blocked", "ip saddr @public accept", "ip saddr . ip daddr @learned accept", "drop"}
	cat := func(parts ...[]string) []string {
		var out []string
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	proxied, withAPI := p, p
	proxied.proxyPort, proxied.egressPorts = 3128, []uint16{80, 443}
	withAPI.apiPort = 7779
	tests := []struct {
		name   string
		params ruleParams
		want   map[string][]string
	}{
		{
			name:   "no proxy, no box API",
			params: p,
			want: map[string][]string{
				"input":    cat(inputHead, []string{"drop"}),
				"from_box": cat(fromBoxHead, fromBoxTail),
			},
		},
		{
			name:   "egress proxy",
			params: proxied,
			want: map[string][]string{
				"input": cat(inputHead, []string{"ip saddr @egress ip daddr 10.213.0.1/32 tcp dport 3128 accept", "drop"}),
				// After allow_cidrs, as before: HTTP/3 of proxied boxes is dropped.
				"from_box": cat(fromBoxHead, []string{"ip saddr @egress udp dport 443 drop"}, fromBoxTail),
				"prerouting": {"iifname sbx0 ip saddr @egress tcp dport 80 redirect to :3128",
					"iifname sbx0 ip saddr @egress tcp dport 443 redirect to :3128"},
			},
		},
		{
			name:   "box API",
			params: withAPI,
			want: map[string][]string{
				"input":    cat(inputHead, []string{"ip saddr @api ip daddr 10.213.0.1/32 tcp dport 7779 accept", "drop"}),
				"from_box": cat(fromBoxHead, fromBoxTail),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := map[string][]string{}
			for chain, rs := range baseRules(tt.params) {
				if len(rs) > 0 {
					got[chain] = renderRules(rs)
				}
			}
			want := map[string][]string{}
			for k, v := range common {
				want[k] = v
			}
			for k, v := range tt.want {
				want[k] = v
			}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("rules (-want +got):\n%s", d)
			}
		})
	}
}

func TestBoxMembership(t *testing.T) {
	p := ruleParams{bridge: "sbx0", subnet: pfx("10.213.0.0/16"), gateway: netip.MustParseAddr("10.213.0.1")}
	pp := p
	pp.proxyPort, pp.egressPorts, pp.apiPort = 3128, []uint16{80, 443}, 7779
	prefixes := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, pfx(s))
		}
		return out
	}
	tests := []struct {
		name   string
		params ruleParams
		pol    Policy
		want   membership
	}{
		{name: "public", params: p, pol: Policy{Mode: ModePublic}, want: membership{public: true}},
		{
			name: "public with holes and denials", params: p,
			pol:  Policy{Mode: ModePublic, AllowCIDRs: prefixes("10.77.0.0/24"), DenyCIDRs: prefixes("8.8.8.8/32")},
			want: membership{public: true, allow: prefixes("10.77.0.0/24"), deny: prefixes("8.8.8.8/32")},
		},
		{
			name: "allow", params: p,
			pol:  Policy{Mode: ModeAllow, AllowCIDRs: prefixes("198.51.100.10/32"), AllowDomains: []string{"*.allowed.test"}},
			want: membership{allow: prefixes("198.51.100.10/32")},
		},
		{name: "allow, proxied", params: pp, pol: Policy{Mode: ModeAllow, AllowDomains: []string{"*.allowed.test"}},
			want: membership{egress: true}},
		{name: "public with secrets, proxied", params: pp,
			pol:  Policy{Mode: ModePublic, Secrets: []Secret{{Name: "K", Domains: []string{"api.test"}}}},
			want: membership{public: true, egress: true}},
		{name: "public without secrets, proxy on", params: pp, pol: Policy{Mode: ModePublic}, want: membership{public: true}},
		{name: "API access", params: pp, pol: Policy{Mode: ModePublic, APIAccess: true}, want: membership{public: true, api: true}},
		{name: "API access, no API port", params: p, pol: Policy{Mode: ModePublic, APIAccess: true}, want: membership{public: true}},
		{
			// Only forwarded traffic sees the allow set: the host stays
			// closed whatever it covers (input has no allow lookup).
			name: "allow 0.0.0.0/0 and 10.0.0.0/8", params: pp,
			pol:  Policy{Mode: ModeAllow, AllowCIDRs: prefixes("0.0.0.0/0", "10.0.0.0/8")},
			want: membership{egress: true, allow: prefixes("0.0.0.0/0")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := boxMembership(tt.params, tt.pol)
			if d := cmp.Diff(tt.want, got, cmp.AllowUnexported(membership{}), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); d != "" {
				t.Errorf("membership (-want +got):\n%s", d)
			}
		})
	}
}

func TestDisjointPrefixes(t *testing.T) {
	tests := []struct {
		in, want []string
	}{
		{in: nil, want: nil},
		{in: []string{"10.0.0.0/8", "10.1.0.0/16", "10.1.2.3/32"}, want: []string{"10.0.0.0/8"}},
		{in: []string{"10.1.2.3/32", "10.1.0.0/16", "10.0.0.0/8"}, want: []string{"10.0.0.0/8"}},
		{in: []string{"10.1.0.0/16", "10.2.0.0/16", "10.1.0.0/16"}, want: []string{"10.1.0.0/16", "10.2.0.0/16"}},
		{in: []string{"10.0.0.0/16", "10.0.0.0/8", "11.0.0.5/32", "9.0.0.0/8"}, want: []string{"9.0.0.0/8", "10.0.0.0/8", "11.0.0.5/32"}},
		{in: []string{"10.0.0.7/8"}, want: []string{"10.0.0.0/8"}}, // masked
		{in: []string{"1.2.3.4/32", "0.0.0.0/0"}, want: []string{"0.0.0.0/0"}},
	}
	for _, tt := range tests {
		var in []netip.Prefix
		for _, s := range tt.in {
			in = append(in, netip.MustParsePrefix(s))
		}
		var got []string
		for _, p := range DisjointPrefixes(in) {
			got = append(got, p.String())
		}
		if d := cmp.Diff(tt.want, got); d != "" {
			t.Errorf("DisjointPrefixes(%v) (-want +got):\n%s", tt.in, d)
		}
	}
}
