package network

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestBoxRules(t *testing.T) {
	p := ruleParams{bridge: "sbx0", subnet: pfx("10.213.0.0/16"), gateway: netip.MustParseAddr("10.213.0.1")}
	dnsIn := []string{
		"ip daddr 10.213.0.1/32 udp dport 53 accept",
		"ip daddr 10.213.0.1/32 tcp dport 53 accept",
	}
	pp := p
	pp.proxyPort, pp.egressPorts = 3128, []uint16{80, 443}
	never := []string{"ip daddr 10.213.0.0/16 drop", "ip daddr 127.0.0.0/8 drop"}
	cat := func(parts ...[]string) []string {
		var out []string
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	tests := []struct {
		name            string
		params          *ruleParams
		pol             Policy
		wantIn, wantFwd []string
	}{
		{
			name:    "public",
			pol:     Policy{Mode: ModePublic},
			wantIn:  cat(dnsIn, []string{"drop"}),
			wantFwd: cat(never, []string{"jump blocked", "accept"}),
		},
		{
			name:   "public with holes and denials",
			pol:    Policy{Mode: ModePublic, AllowCIDRs: []netip.Prefix{pfx("10.77.0.0/24")}, DenyCIDRs: []netip.Prefix{pfx("8.8.8.8/32")}},
			wantIn: cat(dnsIn, []string{"drop"}),
			wantFwd: cat([]string{"ip daddr 8.8.8.8/32 drop"}, never,
				[]string{"ip daddr 10.77.0.0/24 accept", "jump blocked", "accept"}),
		},
		{
			name:    "allow",
			pol:     Policy{Mode: ModeAllow, AllowCIDRs: []netip.Prefix{pfx("198.51.100.10/32")}, AllowDomains: []string{"*.allowed.test"}},
			wantIn:  cat(dnsIn, []string{"drop"}),
			wantFwd: cat(never, []string{"ip daddr 198.51.100.10/32 accept", "jump blocked", "ip daddr @dns_n1 accept", "drop"}),
		},
		{
			name:    "allow, proxied",
			params:  &pp,
			pol:     Policy{Mode: ModeAllow, AllowDomains: []string{"*.allowed.test"}},
			wantIn:  cat(dnsIn, []string{"ip daddr 10.213.0.1/32 tcp dport 3128 accept", "drop"}),
			wantFwd: cat(never, []string{"udp dport 443 drop", "jump blocked", "ip daddr @dns_n1 accept", "drop"}),
		},
		{
			name:    "public with secrets, proxied",
			params:  &pp,
			pol:     Policy{Mode: ModePublic, Secrets: []Secret{{Name: "K", Domains: []string{"api.test"}}}},
			wantIn:  cat(dnsIn, []string{"ip daddr 10.213.0.1/32 tcp dport 3128 accept", "drop"}),
			wantFwd: cat(never, []string{"udp dport 443 drop", "jump blocked", "accept"}),
		},
		{
			// The host (the gateway and every other address of it) stays
			// closed whatever allow_cidrs cover: only DNS and the proxy.
			name:    "allow 0.0.0.0/0 and 10.0.0.0/8 open nothing on the host",
			params:  &pp,
			pol:     Policy{Mode: ModeAllow, AllowCIDRs: []netip.Prefix{pfx("0.0.0.0/0"), pfx("10.0.0.0/8")}},
			wantIn:  cat(dnsIn, []string{"ip daddr 10.213.0.1/32 tcp dport 3128 accept", "drop"}),
			wantFwd: cat(never, []string{"ip daddr 0.0.0.0/0 accept", "ip daddr 10.0.0.0/8 accept", "udp dport 443 drop", "jump blocked", "ip daddr @dns_n1 accept", "drop"}),
		},
		{
			name:    "public 0.0.0.0/0 opens nothing on the host",
			pol:     Policy{Mode: ModePublic, AllowCIDRs: []netip.Prefix{pfx("0.0.0.0/0")}},
			wantIn:  cat(dnsIn, []string{"drop"}),
			wantFwd: cat(never, []string{"ip daddr 0.0.0.0/0 accept", "jump blocked", "accept"}),
		},
		{
			name:    "public without secrets, proxy on",
			params:  &pp,
			pol:     Policy{Mode: ModePublic},
			wantIn:  cat(dnsIn, []string{"drop"}),
			wantFwd: cat(never, []string{"jump blocked", "accept"}),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			params := p
			if tt.params != nil {
				params = *tt.params
			}
			in, fwd := boxRules(params, tt.pol, "dns_n1")
			if d := cmp.Diff(tt.wantIn, renderRules(in)); d != "" {
				t.Errorf("input chain (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tt.wantFwd, renderRules(fwd)); d != "" {
				t.Errorf("forward chain (-want +got):\n%s", d)
			}
		})
	}
}

func TestBaseRules(t *testing.T) {
	p := ruleParams{bridge: "sbx0", subnet: pfx("10.213.0.0/16"), gateway: netip.MustParseAddr("10.213.0.1"),
		egressPorts: []uint16{80, 443}, proxyPort: 3128}
	got := map[string][]string{}
	for chain, rs := range baseRules(p) {
		got[chain] = renderRules(rs)
	}
	want := map[string][]string{
		"input": {"iifname != sbx0 return", "meta nfproto ipv6 drop", "ct state established,related accept",
			"ip saddr vmap @in_map", "drop"},
		"forward":     {"iifname sbx0 jump from_box", "oifname sbx0 jump to_box"},
		"from_box":    {"meta nfproto ipv6 drop", "ip saddr vmap @fwd_map", "drop"},
		"to_box":      {"ct state established,related accept", "drop"},
		"postrouting": {"oifname != sbx0 ip saddr 10.213.0.0/16 masquerade"},
		"prerouting": {"iifname sbx0 ip saddr @egress tcp dport 80 redirect to :3128",
			"iifname sbx0 ip saddr @egress tcp dport 443 redirect to :3128"},
		"blocked": {"ip daddr 0.0.0.0/8 drop", "ip daddr 10.0.0.0/8 drop", "ip daddr 100.64.0.0/10 drop",
			"ip daddr 127.0.0.0/8 drop", "ip daddr 169.254.0.0/16 drop", "ip daddr 172.16.0.0/12 drop",
			"ip daddr 192.0.0.0/24 drop", "ip daddr 192.168.0.0/16 drop", "ip daddr 198.18.0.0/15 drop",
			"ip daddr 224.0.0.0/4 drop", "ip daddr 240.0.0.0/4 drop"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("base rules (-want +got):\n%s", d)
	}
}
