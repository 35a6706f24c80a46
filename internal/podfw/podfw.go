// Package podfw is the firewall a kubernetes pod's init container
// programs in the pod's network namespace before user code starts
// (`sbx-agent sbx-firewall BACKEND MODE [FLAG CIDR]... PORT...`): the way
// sbx's network modes hold on clusters whose CNI does not enforce
// NetworkPolicy. Two backends: nftables (runc pods: one table in the pod's
// netns) and iptables (gVisor pods: runsc's netstack has no nftables but
// takes the legacy x_tables setsockopts, iptables.go). The init container
// holds NET_ADMIN (and, for iptables, NET_RAW); the box container holds
// neither, so box root can neither change nor flush the rules (EPERM).
// See docs/DRIVERS.md.
//
// For nftables, Rules (what the driver asks for, plus what the pod itself
// knows: see WithPodFacts) become a list of NFTRule (NFTList), which
// podfw_linux.go lowers. The iptables backend takes mode none only
// (NoneRules, lowered by iptables.go): gVisor's iptables has no conntrack
// match to let replies of the box's own connections in, so the connected
// modes are refused there.
package podfw

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Arg is argv[1] of the agent binary run as the firewall init container.
const Arg = "sbx-firewall"

// The backends: how the rules are programmed.
const (
	// BackendNFTables writes an nftables table (runc and other runtimes
	// sharing the node's kernel).
	BackendNFTables = "nftables"
	// BackendIPTables replaces the IPv4 and IPv6 iptables filter tables
	// (gVisor, whose netstack implements these and not nftables). It
	// takes mode none only.
	BackendIPTables = "iptables"
)

// Table is the nftables table (family inet) the firewall owns.
const Table = "sbx_pod"

// Modes.
const (
	// ModeNone: loopback, and the agent's ports inbound (with their
	// replies), nothing else in or out.
	ModeNone = "none"
	// ModePublic: as none, and out to anything but Deny, Never and the
	// Blocked ranges Allow does not cover; DNS to the DNS servers.
	ModePublic = "public"
	// ModeAllow: as none, and out to Allow less Deny and Never.
	ModeAllow = "allow"
)

// Flags of the connected modes, each followed by one value.
const (
	FlagAllow = "-allow"
	FlagDeny  = "-deny"
	FlagBlock = "-block"
	FlagNever = "-never"
	FlagDNS   = "-dns"
)

// EnvNodeIP is the init container's variable holding its node's address
// (the downward API's status.hostIP): never reachable.
const EnvNodeIP = "SBX_NODE_IP"

// Rules is what the firewall enforces.
type Rules struct {
	Backend string
	Mode    string
	// AgentPorts take TCP connections from anywhere (the daemon's
	// address is not known to the pod); the agent authenticates them.
	AgentPorts []uint16
	// Deny is unreachable, first (a sandbox's deny_cidrs).
	Deny []netip.Prefix
	// DNS are nameservers reachable on UDP and TCP port 53 (after Deny,
	// before Never: the cluster's DNS service is in its service range).
	DNS []netip.Addr
	// Never is the cluster itself (node, pods, services, API server):
	// unreachable whatever Allow says.
	Never []netip.Prefix
	// Allow is reachable (allow mode: all there is; public mode: holes
	// in Blocked).
	Allow []netip.Prefix
	// Blocked (public mode) is unreachable unless Allow covers it.
	Blocked []netip.Prefix
}

// maxEntries bounds each list, as the API bounds a policy's.
const maxEntries = 4096

// Parse reads `BACKEND MODE [FLAG VALUE]... [AGENT-PORT...]` (argv after
// Arg). Mode none takes no flags; the iptables backend takes mode none
// only.
func Parse(args []string) (Rules, error) {
	if len(args) < 2 {
		return Rules{}, fmt.Errorf("usage: sbx-agent %s %s|%s MODE [FLAG VALUE]... [AGENT-PORT...]", Arg, BackendNFTables, BackendIPTables)
	}
	r := Rules{Backend: args[0], Mode: args[1]}
	if r.Backend != BackendNFTables && r.Backend != BackendIPTables {
		return Rules{}, fmt.Errorf("firewall backend %q: want %q or %q", r.Backend, BackendNFTables, BackendIPTables)
	}
	if r.Mode != ModeNone && r.Mode != ModePublic && r.Mode != ModeAllow {
		return Rules{}, fmt.Errorf("firewall mode %q: want %q, %q or %q", r.Mode, ModeNone, ModePublic, ModeAllow)
	}
	if r.Backend == BackendIPTables && r.Mode != ModeNone {
		return Rules{}, fmt.Errorf("firewall mode %q: the %s backend takes %q only", r.Mode, BackendIPTables, ModeNone)
	}
	rest := args[2:]
	for len(rest) > 0 && strings.HasPrefix(rest[0], "-") {
		flag := rest[0]
		if r.Mode == ModeNone {
			return Rules{}, fmt.Errorf("firewall mode none takes no %s", flag)
		}
		if len(rest) < 2 {
			return Rules{}, fmt.Errorf("firewall flag %s: no value", flag)
		}
		v := rest[1]
		rest = rest[2:]
		var list *[]netip.Prefix
		switch flag {
		case FlagAllow:
			list = &r.Allow
		case FlagDeny:
			list = &r.Deny
		case FlagBlock:
			list = &r.Blocked
		case FlagNever:
			list = &r.Never
		case FlagDNS:
			a, err := netip.ParseAddr(v)
			if err != nil || !a.Is4() {
				return Rules{}, fmt.Errorf("firewall %s %q: want an IPv4 address", flag, v)
			}
			r.DNS = append(r.DNS, a)
			continue
		default:
			return Rules{}, fmt.Errorf("firewall flag %q: want %s, %s, %s, %s or %s", flag, FlagAllow, FlagDeny, FlagBlock, FlagNever, FlagDNS)
		}
		p, err := netip.ParsePrefix(v)
		if err != nil || !p.Addr().Is4() || p != p.Masked() {
			return Rules{}, fmt.Errorf("firewall %s %q: want a masked IPv4 CIDR", flag, v)
		}
		if len(*list) >= maxEntries {
			return Rules{}, fmt.Errorf("firewall %s: more than %d entries", flag, maxEntries)
		}
		*list = append(*list, p)
	}
	for _, a := range rest {
		p, err := strconv.ParseUint(a, 10, 16)
		if err != nil || p == 0 {
			return Rules{}, fmt.Errorf("agent port %q: want 1-65535", a)
		}
		r.AgentPorts = append(r.AgentPorts, uint16(p))
	}
	return r, nil
}

// Args is r as Parse reads it (argv after Arg).
func (r Rules) Args() []string {
	out := []string{r.Backend, r.Mode}
	for _, l := range []struct {
		flag string
		ps   []netip.Prefix
	}{{FlagDeny, r.Deny}, {FlagNever, r.Never}, {FlagAllow, r.Allow}, {FlagBlock, r.Blocked}} {
		for _, p := range l.ps {
			out = append(out, l.flag, p.String())
		}
	}
	for _, a := range r.DNS {
		out = append(out, FlagDNS, a.String())
	}
	for _, p := range r.AgentPorts {
		out = append(out, strconv.Itoa(int(p)))
	}
	return out
}

// PodFacts is what the pod knows of its cluster when the firewall runs.
type PodFacts struct {
	// NodeIP is EnvNodeIP; ServiceHost is KUBERNETES_SERVICE_HOST (the
	// API server's ClusterIP), which the kubelet sets in every container.
	NodeIP, ServiceHost string
	// ResolvConf is the pod's /etc/resolv.conf.
	ResolvConf []byte
	// Networks are the pod's interfaces' IPv4 networks (other pods on
	// the node's bridge), Gateways its routes' next hops (the node).
	Networks []netip.Prefix
	Gateways []netip.Addr
}

// WithPodFacts adds to r (public or allow mode) what the pod knows: its
// node, the API server's ClusterIP, its networks and gateways are Never;
// in public mode the nameservers of its resolv.conf are DNS. (Allow mode
// gets no DNS: a resolver that recurses is a way out for any name.)
func (r Rules) WithPodFacts(f PodFacts) Rules {
	if r.Mode == ModeNone {
		return r
	}
	r.Never = append([]netip.Prefix(nil), r.Never...)
	for _, s := range []string{f.NodeIP, f.ServiceHost} {
		if a, err := netip.ParseAddr(strings.TrimSpace(s)); err == nil && a.Is4() {
			r.Never = append(r.Never, netip.PrefixFrom(a, 32))
		}
	}
	for _, n := range f.Networks {
		if n.Addr().Is4() && !n.Addr().IsLoopback() {
			r.Never = append(r.Never, n.Masked())
		}
	}
	for _, g := range f.Gateways {
		if g.Is4() {
			r.Never = append(r.Never, netip.PrefixFrom(g, 32))
		}
	}
	if r.Mode == ModePublic {
		r.DNS = append(append([]netip.Addr(nil), r.DNS...), nameservers(f.ResolvConf)...)
	}
	return r
}

// nameservers returns resolv.conf's IPv4 nameservers.
func nameservers(conf []byte) []netip.Addr {
	var out []netip.Addr
	sc := bufio.NewScanner(bytes.NewReader(conf))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "nameserver" {
			if a, err := netip.ParseAddr(f[1]); err == nil && a.Is4() {
				out = append(out, a)
			}
		}
	}
	return out
}

// Chains.
const (
	ChainInput  = "input"
	ChainOutput = "output"
)

// NFTRule is one rule of the nftables backend: every set field is a match
// (all must hold) and Verdict is what a match does. The chains' policy is
// drop.
type NFTRule struct {
	Chain string // ChainInput or ChainOutput
	// Lo: the loopback interface (iif on input, oif on output).
	Lo bool
	// ND: ICMPv6 neighbour discovery (types 133-136).
	ND bool
	// IPv6: any IPv6 packet.
	IPv6 bool
	// Proto is "tcp" or "udp" ("": any), SPort and DPort its ports.
	Proto        string
	SPort, DPort uint16
	// Remote is the far end: destination on output, source on input.
	Remote netip.Prefix
	// CtState is "", "related", "established" or "established,related".
	CtState string
	// Verdict is "accept" or "drop".
	Verdict string
}

// String renders the rule in nft syntax (for tests and logs).
func (r NFTRule) String() string {
	w := []string{r.Chain + ":"}
	if r.Lo {
		w = append(w, map[string]string{ChainInput: "iifname lo", ChainOutput: "oifname lo"}[r.Chain])
	}
	if r.ND {
		w = append(w, "icmpv6 type 133-136")
	}
	if r.IPv6 {
		w = append(w, "meta nfproto ipv6")
	}
	if r.Remote.IsValid() {
		w = append(w, map[string]string{ChainInput: "ip saddr", ChainOutput: "ip daddr"}[r.Chain], r.Remote.String())
	}
	if r.Proto != "" {
		w = append(w, "meta l4proto "+r.Proto)
	}
	if r.SPort != 0 {
		w = append(w, r.Proto+" sport "+strconv.Itoa(int(r.SPort)))
	}
	if r.DPort != 0 {
		w = append(w, r.Proto+" dport "+strconv.Itoa(int(r.DPort)))
	}
	if r.CtState != "" {
		w = append(w, "ct state "+r.CtState)
	}
	return strings.Join(append(w, r.Verdict), " ")
}

// NFTList returns r's rules for the nftables backend, in order (first
// match wins; no match: drop).
//
// Every mode: loopback and neighbour discovery both ways; TCP in to the
// agent's ports and out from them (the replies). Mode none adds ICMP
// errors in (related) and nothing else. The connected modes add, in:
// replies to the box's own connections (established, related); out: the
// rest of flows already let through, IPv6 dropped (allow-lists are IPv4),
// then Deny dropped, DNS accepted on port
// 53, Never dropped, Allow accepted, and in public mode Blocked dropped and
// the rest accepted.
func (r Rules) NFTList() []NFTRule {
	in := func(x NFTRule) NFTRule { x.Chain = ChainInput; return x }
	out := func(x NFTRule) NFTRule { x.Chain = ChainOutput; return x }
	rs := []NFTRule{
		in(NFTRule{Lo: true, Verdict: "accept"}), out(NFTRule{Lo: true, Verdict: "accept"}),
		in(NFTRule{ND: true, Verdict: "accept"}), out(NFTRule{ND: true, Verdict: "accept"}),
	}
	if r.Mode == ModeNone {
		rs = append(rs, in(NFTRule{CtState: "related", Verdict: "accept"}))
	} else {
		rs = append(rs, in(NFTRule{CtState: "established,related", Verdict: "accept"}))
	}
	for _, p := range r.AgentPorts {
		rs = append(rs, in(NFTRule{Proto: "tcp", DPort: p, Verdict: "accept"}),
			out(NFTRule{Proto: "tcp", SPort: p, CtState: "established", Verdict: "accept"}))
	}
	if r.Mode == ModeNone {
		return rs
	}
	// The rules are fixed for the pod's life, so a flow they let start
	// may go on: its packets skip the lists below (a box with a thousand
	// CIDRs pays for them once per connection, not per packet).
	rs = append(rs, out(NFTRule{CtState: "established,related", Verdict: "accept"}),
		out(NFTRule{IPv6: true, Verdict: "drop"}))
	for _, p := range r.Deny {
		rs = append(rs, out(NFTRule{Remote: p, Verdict: "drop"}))
	}
	for _, a := range r.DNS {
		ns := netip.PrefixFrom(a, 32)
		rs = append(rs, out(NFTRule{Remote: ns, Proto: "udp", DPort: 53, Verdict: "accept"}),
			out(NFTRule{Remote: ns, Proto: "tcp", DPort: 53, Verdict: "accept"}))
	}
	for _, p := range r.Never {
		rs = append(rs, out(NFTRule{Remote: p, Verdict: "drop"}))
	}
	for _, p := range r.Allow {
		rs = append(rs, out(NFTRule{Remote: p, Verdict: "accept"}))
	}
	if r.Mode == ModePublic {
		for _, p := range r.Blocked {
			rs = append(rs, out(NFTRule{Remote: p, Verdict: "drop"}))
		}
		rs = append(rs, out(NFTRule{Verdict: "accept"}))
	}
	return rs
}
