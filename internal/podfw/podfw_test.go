package podfw

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

func prefixes(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range s {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    Rules
		wantErr string
	}{
		{args: []string{"nftables", "none", "7700", "7701"}, want: Rules{Backend: BackendNFTables, Mode: ModeNone, AgentPorts: []uint16{7700, 7701}}},
		{args: []string{"iptables", "none", "7700"}, want: Rules{Backend: BackendIPTables, Mode: ModeNone, AgentPorts: []uint16{7700}}},
		{args: []string{"nftables", "none"}, want: Rules{Backend: BackendNFTables, Mode: ModeNone}},
		{args: []string{"nftables", "public", "-deny", "1.2.3.0/24", "-never", "10.96.0.0/16", "-allow", "10.1.0.0/16",
			"-block", "10.0.0.0/8", "-dns", "10.96.0.10", "7700"},
			want: Rules{Backend: BackendNFTables, Mode: ModePublic, AgentPorts: []uint16{7700}, Deny: prefixes("1.2.3.0/24"), Never: prefixes("10.96.0.0/16"),
				Allow: prefixes("10.1.0.0/16"), Blocked: prefixes("10.0.0.0/8"), DNS: []netip.Addr{netip.MustParseAddr("10.96.0.10")}}},
		{args: []string{"nftables", "allow", "-allow", "203.0.113.7/32"}, want: Rules{Backend: BackendNFTables, Mode: ModeAllow, Allow: prefixes("203.0.113.7/32")}},
		{args: nil, wantErr: "usage"},
		{args: []string{"nftables"}, wantErr: "usage"},
		{args: []string{"none", "7700"}, wantErr: `backend "none"`},
		{args: []string{"ebpf", "none"}, wantErr: `backend "ebpf"`},
		{args: []string{"nftables", "open"}, wantErr: `mode "open"`},
		{args: []string{"iptables", "public"}, wantErr: `mode "public": the iptables backend takes "none" only`},
		{args: []string{"iptables", "allow", "-allow", "1.2.3.4/32"}, wantErr: `mode "allow": the iptables backend`},
		{args: []string{"nftables", "none", "-allow", "1.2.3.4/32"}, wantErr: "mode none takes no -allow"},
		{args: []string{"nftables", "public", "-allow"}, wantErr: "-allow: no value"},
		{args: []string{"nftables", "public", "-open", "1.2.3.4/32"}, wantErr: `flag "-open"`},
		{args: []string{"nftables", "public", "-allow", "1.2.3.4/24"}, wantErr: `-allow "1.2.3.4/24": want a masked IPv4 CIDR`},
		{args: []string{"nftables", "public", "-deny", "2001:db8::/32"}, wantErr: `-deny "2001:db8::/32"`},
		{args: []string{"nftables", "public", "-dns", "x"}, wantErr: `-dns "x"`},
		{args: []string{"nftables", "public", "7700", "-allow", "1.2.3.4/32"}, wantErr: `agent port "-allow"`},
		{args: []string{"iptables", "none", "0"}, wantErr: `agent port "0"`},
		{args: []string{"nftables", "none", "65536"}, wantErr: `agent port "65536"`},
		{args: []string{"nftables", "none", "x"}, wantErr: `agent port "x"`},
	} {
		got, err := Parse(tc.args)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Parse(%q): got %v, want an error with %q", tc.args, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", tc.args, got, err, tc.want)
		}
		if back, err := Parse(got.Args()); err != nil || !reflect.DeepEqual(back, got) {
			t.Errorf("Parse(%q.Args()) = %+v, %v; want %+v", got.Args(), back, err, got)
		}
	}
}

func TestList(t *testing.T) {
	common := []string{
		"input: iifname lo accept", "output: oifname lo accept",
		"input: icmpv6 type 133-136 accept", "output: icmpv6 type 133-136 accept",
	}
	agent := []string{
		"input: meta l4proto tcp tcp dport 7700 accept", "output: meta l4proto tcp tcp sport 7700 ct state established accept",
	}
	cat := func(ls ...[]string) []string {
		var out []string
		for _, l := range ls {
			out = append(out, l...)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		r    Rules
		want []string
	}{
		{"none", Rules{Mode: ModeNone, AgentPorts: []uint16{7700}},
			cat(common, []string{"input: ct state related accept"}, agent)},
		{"public", Rules{Mode: ModePublic, AgentPorts: []uint16{7700}, Deny: prefixes("203.0.113.0/24"),
			DNS: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Never: prefixes("10.96.0.0/16"),
			Allow: prefixes("10.1.0.0/16"), Blocked: prefixes("10.0.0.0/8")},
			cat(common, []string{"input: ct state established,related accept"}, agent, []string{
				"output: ct state established,related accept",
				"output: meta nfproto ipv6 drop",
				"output: ip daddr 203.0.113.0/24 drop",
				"output: ip daddr 10.96.0.10/32 meta l4proto udp udp dport 53 accept",
				"output: ip daddr 10.96.0.10/32 meta l4proto tcp tcp dport 53 accept",
				"output: ip daddr 10.96.0.0/16 drop",
				"output: ip daddr 10.1.0.0/16 accept",
				"output: ip daddr 10.0.0.0/8 drop",
				"output: accept",
			})},
		{"allow", Rules{Mode: ModeAllow, AgentPorts: []uint16{7700}, Never: prefixes("10.244.0.0/24"), Allow: prefixes("0.0.0.0/0")},
			cat(common, []string{"input: ct state established,related accept"}, agent, []string{
				"output: ct state established,related accept",
				"output: meta nfproto ipv6 drop",
				"output: ip daddr 10.244.0.0/24 drop",
				"output: ip daddr 0.0.0.0/0 accept",
			})},
	} {
		var got []string
		for _, r := range tc.r.NFTList() {
			got = append(got, r.String())
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: NFTList():\n got %q\nwant %q", tc.name, got, tc.want)
		}
	}
}

func TestWithPodFacts(t *testing.T) {
	f := PodFacts{
		NodeIP: "10.200.0.1", ServiceHost: "10.96.0.1",
		ResolvConf: []byte("search x\nnameserver 10.255.255.53\nnameserver ::1\nnameserver bad\noptions ndots:5\n"),
		Networks:   prefixes("10.244.0.7/24", "127.0.0.1/8"),
		Gateways:   []netip.Addr{netip.MustParseAddr("10.244.0.1")},
	}
	got := Rules{Mode: ModePublic, Never: prefixes("10.96.0.0/16")}.WithPodFacts(f)
	wantNever := prefixes("10.96.0.0/16", "10.200.0.1/32", "10.96.0.1/32", "10.244.0.0/24", "10.244.0.1/32")
	if !reflect.DeepEqual(got.Never, wantNever) {
		t.Errorf("public Never: got %v, want %v", got.Never, wantNever)
	}
	if want := []netip.Addr{netip.MustParseAddr("10.255.255.53")}; !reflect.DeepEqual(got.DNS, want) {
		t.Errorf("public DNS: got %v, want %v", got.DNS, want)
	}
	allow := Rules{Mode: ModeAllow}.WithPodFacts(f)
	if len(allow.DNS) != 0 || len(allow.Never) != 4 {
		t.Errorf("allow: DNS %v, Never %v; want no DNS and the node, service host, network and gateway", allow.DNS, allow.Never)
	}
	none := Rules{Mode: ModeNone}.WithPodFacts(f)
	if !reflect.DeepEqual(none, Rules{Mode: ModeNone}) {
		t.Errorf("none: got %+v, want it unchanged", none)
	}
}
