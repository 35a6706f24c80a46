package network

import (
	"fmt"
	"net/netip"
	"strings"
)

// rule is one nftables rule in a form that is easy to generate and to test;
// nft_linux.go turns it into expressions. Every set field is a match (all
// must hold); verdict is "accept", "drop", "return", "jump CHAIN" or "" (for
// rules whose effect is in the match, e.g. a verdict map or masquerade).
type rule struct {
	iif, notIif string // input interface is / is not
	oif, notOif string // output interface is / is not
	ipv6        bool   // the packet is IPv6
	saddr       netip.Prefix
	daddr       netip.Prefix
	daddrSet    string // daddr is in this set
	saddrSet    string // saddr is in this set
	l4proto     string // "tcp" or "udp"
	dport       uint16
	ctEstRel    bool   // ct state established,related
	saddrVmap   string // verdict map lookup of saddr
	masquerade  bool
	redirect    uint16 // redirect to this port on the incoming interface's address
	verdict     string
}

// String renders the rule in nft syntax (for tests and logs).
func (r rule) String() string {
	var w []string
	add := func(s ...string) { w = append(w, s...) }
	if r.iif != "" {
		add("iifname", r.iif)
	}
	if r.notIif != "" {
		add("iifname !=", r.notIif)
	}
	if r.oif != "" {
		add("oifname", r.oif)
	}
	if r.notOif != "" {
		add("oifname !=", r.notOif)
	}
	if r.ipv6 {
		add("meta nfproto ipv6")
	}
	if r.ctEstRel {
		add("ct state established,related")
	}
	if r.saddr.IsValid() {
		add("ip saddr", r.saddr.String())
	}
	if r.daddr.IsValid() {
		add("ip daddr", r.daddr.String())
	}
	if r.saddrSet != "" {
		add("ip saddr @" + r.saddrSet)
	}
	if r.daddrSet != "" {
		add("ip daddr @" + r.daddrSet)
	}
	if r.l4proto != "" {
		add(r.l4proto)
	}
	if r.dport != 0 {
		add("dport", fmt.Sprint(r.dport))
	}
	if r.saddrVmap != "" {
		add("ip saddr vmap @" + r.saddrVmap)
	}
	if r.masquerade {
		add("masquerade")
	}
	if r.redirect != 0 {
		add("redirect to :" + fmt.Sprint(r.redirect))
	}
	if r.verdict != "" {
		add(r.verdict)
	}
	return strings.Join(w, " ")
}

// Names of the table's shared objects.
const (
	chainInput    = "input"
	chainForward  = "forward"
	chainFromBox  = "from_box"
	chainToBox    = "to_box"
	chainBlocked  = "blocked"
	chainPostNAT  = "postrouting"
	chainPreNAT   = "prerouting"
	setEgress     = "egress" // boxes whose egress ports go to the proxy
	mapInput      = "in_map"
	mapForward    = "fwd_map"
	prefixInChain = "i_"
	prefixFwChain = "f_"
	prefixDNSSet  = "dns_"
)

// ruleParams is what the generated rules depend on besides a policy.
type ruleParams struct {
	bridge      string
	subnet      netip.Prefix
	gateway     netip.Addr
	egressPorts []uint16 // TCP ports redirected to the egress proxy
	proxyPort   uint16   // the egress proxy's port on the gateway (0: none)
	apiPort     uint16   // the daemon's box API port on the gateway (0: none)
}

// baseRules returns the rules of the shared chains.
func baseRules(p ruleParams) map[string][]rule {
	blocked := make([]rule, 0, len(blockedRanges))
	for _, b := range blockedRanges {
		blocked = append(blocked, rule{daddr: b, verdict: "drop"})
	}
	var redirects []rule
	if p.proxyPort != 0 {
		for _, port := range p.egressPorts {
			redirects = append(redirects, rule{iif: p.bridge, saddrSet: setEgress, l4proto: "tcp", dport: port, redirect: p.proxyPort})
		}
	}
	return map[string][]rule{
		chainInput: {
			{notIif: p.bridge, verdict: "return"},
			{ipv6: true, verdict: "drop"},
			{ctEstRel: true, verdict: "accept"},
			{saddrVmap: mapInput},
			{verdict: "drop"},
		},
		chainForward: {
			{iif: p.bridge, verdict: "jump " + chainFromBox},
			{oif: p.bridge, verdict: "jump " + chainToBox},
		},
		chainFromBox: {
			{ipv6: true, verdict: "drop"},
			{saddrVmap: mapForward},
			{verdict: "drop"},
		},
		chainToBox: {
			{ctEstRel: true, verdict: "accept"},
			{verdict: "drop"},
		},
		chainBlocked: blocked,
		chainPostNAT: {
			{saddr: p.subnet, notOif: p.bridge, masquerade: true},
		},
		chainPreNAT: redirects,
	}
}

// boxRules returns the rules of one box's input chain (traffic to the host)
// and forward chain (traffic through it). dnsSet names the set of addresses
// the DNS forwarder learned for the box.
func boxRules(p ruleParams, pol Policy, dnsSet string) (in, fwd []rule) {
	// The host: only the DNS forwarder and (for proxied boxes) the egress
	// proxy, on the gateway. No allow_cidrs entry opens any other host
	// address or port, the gateway's included: a box reaching host services
	// is what the sandbox boundary forbids.
	gw := netip.PrefixFrom(p.gateway, 32)
	in = []rule{
		{daddr: gw, l4proto: "udp", dport: 53, verdict: "accept"},
		{daddr: gw, l4proto: "tcp", dport: 53, verdict: "accept"},
	}
	if p.proxyPort != 0 && pol.proxied() {
		// Connections the prerouting chain redirected to the egress proxy.
		in = append(in, rule{daddr: gw, l4proto: "tcp", dport: p.proxyPort, verdict: "accept"})
	}
	if p.apiPort != 0 && pol.APIAccess {
		// The box API: it serves only scoped tokens, each from its own box.
		in = append(in, rule{daddr: gw, l4proto: "tcp", dport: p.apiPort, verdict: "accept"})
	}
	in = append(in, rule{verdict: "drop"})

	var deny, allow []rule
	for _, c := range pol.DenyCIDRs {
		deny = append(deny, rule{daddr: c, verdict: "drop"})
	}
	for _, c := range pol.AllowCIDRs {
		allow = append(allow, rule{daddr: c, verdict: "accept"})
	}
	// Never reachable whatever allow_cidrs say: other boxes and loopback.
	fwd = append(fwd, deny...)
	fwd = append(fwd,
		rule{daddr: p.subnet, verdict: "drop"},
		rule{daddr: netip.MustParsePrefix("127.0.0.0/8"), verdict: "drop"})
	fwd = append(fwd, allow...)
	if p.proxyPort != 0 && pol.proxied() {
		// HTTP/3 (QUIC) would bypass the proxy's host checks and secret
		// substitution: clients fall back to TCP.
		fwd = append(fwd, rule{l4proto: "udp", dport: 443, verdict: "drop"})
	}
	switch pol.Mode {
	case ModePublic:
		fwd = append(fwd, rule{verdict: "jump " + chainBlocked}, rule{verdict: "accept"})
	default: // allow: what allowed names resolve to, but never blocked ranges
		fwd = append(fwd, rule{verdict: "jump " + chainBlocked}, rule{daddrSet: dnsSet, verdict: "accept"}, rule{verdict: "drop"})
	}
	return in, fwd
}

func renderRules(rs []rule) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.String()
	}
	return out
}
