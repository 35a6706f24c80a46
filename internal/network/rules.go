package network

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// rule is one nftables rule in a form that is easy to generate and to test;
// nft_linux.go turns it into expressions. Every set field is a match (all
// must hold); verdict is "accept", "drop", "return", "jump CHAIN" or "" (for
// rules whose effect is in the match, e.g. masquerade).
type rule struct {
	iif, notIif string // input interface is / is not
	oif, notOif string // output interface is / is not
	ipv6        bool   // the packet is IPv6
	saddr       netip.Prefix
	daddr       netip.Prefix
	saddrSet    string // saddr is in this set
	notSaddrSet string // saddr is not in this set
	pairSet     string // saddr . daddr is in this (concatenated) set
	l4proto     string // "tcp" or "udp"
	dport       uint16
	ctEstRel    bool // ct state established,related
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
	if r.saddrSet != "" {
		add("ip saddr @" + r.saddrSet)
	}
	if r.notSaddrSet != "" {
		add("ip saddr != @" + r.notSaddrSet)
	}
	if r.pairSet != "" {
		add("ip saddr . ip daddr @" + r.pairSet)
	}
	if r.saddr.IsValid() {
		add("ip saddr", r.saddr.String())
	}
	if r.daddr.IsValid() {
		add("ip daddr", r.daddr.String())
	}
	if r.l4proto != "" {
		add(r.l4proto)
	}
	if r.dport != 0 {
		add("dport", fmt.Sprint(r.dport))
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

// Names of the table's chains and sets. The chains are the same whatever
// the number of boxes; a box is elements of the sets, keyed by its address.
const (
	chainInput   = "input"
	chainForward = "forward"
	chainFromBox = "from_box"
	chainToBox   = "to_box"
	chainBlocked = "blocked"
	chainPostNAT = "postrouting"
	chainPreNAT  = "prerouting"
	// setBoxes holds every attached box: other sources on the bridge are
	// dropped, and a box out of it has no other effect in the table.
	setBoxes  = "boxes"
	setPublic = "public" // boxes in ModePublic
	setEgress = "egress" // boxes whose egress ports go to the proxy
	setAPI    = "api"    // boxes that may reach the box API
	// setAllow and setDeny hold box . destination range (the box's
	// allow_cidrs and deny_cidrs), setLearned box . address the DNS
	// forwarder learned for it, with a timeout.
	setAllow   = "allow"
	setDeny    = "deny"
	setLearned = "learned"
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

// baseRules returns the table's rules: every policy is in them, and a box's
// own policy is which sets its address is in (boxMembership).
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
	// The host: only the DNS forwarder, the egress proxy (for proxied
	// boxes) and the box API (for boxes with a token), on the gateway. No
	// allow_cidrs entry opens any other host address or port, the
	// gateway's included: a box reaching host services is what the sandbox
	// boundary forbids.
	gw := netip.PrefixFrom(p.gateway, 32)
	input := []rule{
		{notIif: p.bridge, verdict: "return"},
		{ipv6: true, verdict: "drop"},
		{ctEstRel: true, verdict: "accept"},
		{notSaddrSet: setBoxes, verdict: "drop"},
		{daddr: gw, l4proto: "udp", dport: 53, verdict: "accept"},
		{daddr: gw, l4proto: "tcp", dport: 53, verdict: "accept"},
	}
	if p.proxyPort != 0 {
		// Connections the prerouting chain redirected to the egress proxy.
		input = append(input, rule{saddrSet: setEgress, daddr: gw, l4proto: "tcp", dport: p.proxyPort, verdict: "accept"})
	}
	if p.apiPort != 0 {
		// The box API: it serves only scoped tokens, each from its own box.
		input = append(input, rule{saddrSet: setAPI, daddr: gw, l4proto: "tcp", dport: p.apiPort, verdict: "accept"})
	}
	input = append(input, rule{verdict: "drop"})

	fromBox := []rule{
		{ipv6: true, verdict: "drop"},
		{notSaddrSet: setBoxes, verdict: "drop"},
		// deny_cidrs win over everything.
		{pairSet: setDeny, verdict: "drop"},
		// Never reachable whatever allow_cidrs say: other boxes and loopback.
		{daddr: p.subnet, verdict: "drop"},
		{daddr: netip.MustParsePrefix("127.0.0.0/8"), verdict: "drop"},
		{pairSet: setAllow, verdict: "accept"},
	}
	if p.proxyPort != 0 {
		// HTTP/3 (QUIC) would bypass the proxy's host checks and secret
		// substitution: clients fall back to TCP.
		fromBox = append(fromBox, rule{saddrSet: setEgress, l4proto: "udp", dport: 443, verdict: "drop"})
	}
	fromBox = append(fromBox,
		rule{verdict: "jump " + chainBlocked},
		rule{saddrSet: setPublic, verdict: "accept"},
		// allow mode: what allowed names resolved to, never blocked ranges.
		rule{pairSet: setLearned, verdict: "accept"},
		rule{verdict: "drop"})
	return map[string][]rule{
		chainInput: input,
		chainForward: {
			{iif: p.bridge, verdict: "jump " + chainFromBox},
			{oif: p.bridge, verdict: "jump " + chainToBox},
		},
		chainFromBox: fromBox,
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

// membership is a box's policy as the table sees it: which of the shared
// sets hold its address, and the destination ranges of its allow and deny
// entries (disjoint: an interval set refuses overlapping elements).
type membership struct {
	public, egress, api bool
	allow, deny         []netip.Prefix
}

// boxMembership returns the table's view of policy pol.
func boxMembership(p ruleParams, pol Policy) membership {
	return membership{
		public: pol.Mode == ModePublic,
		egress: p.proxyPort != 0 && pol.proxied(),
		api:    p.apiPort != 0 && pol.APIAccess,
		allow:  DisjointPrefixes(pol.AllowCIDRs),
		deny:   DisjointPrefixes(pol.DenyCIDRs),
	}
}

// DisjointPrefixes returns ps masked, sorted, without duplicates and
// without prefixes another one covers: the same addresses, no overlaps.
func DisjointPrefixes(ps []netip.Prefix) []netip.Prefix {
	sorted := make([]netip.Prefix, 0, len(ps))
	for _, p := range ps {
		sorted = append(sorted, p.Masked())
	}
	// By address, the wider first where two start at the same address:
	// prefixes either nest or are disjoint, so one is covered exactly when
	// the last one kept contains its first address.
	slices.SortFunc(sorted, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	var out []netip.Prefix
	for _, p := range sorted {
		if n := len(out); n > 0 && out[n-1].Contains(p.Addr()) {
			continue
		}
		out = append(out, p)
	}
	return out
}

func renderRules(rs []rule) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.String()
	}
	return out
}
