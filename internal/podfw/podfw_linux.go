package podfw

import (
	"encoding/binary"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Apply programs r in the current network namespace with r's backend:
// nftables (applyNFT) or iptables (the IPv4 and IPv6 filter tables
// replaced with NoneRules in front of a drop policy, FORWARD dropping
// everything, each read back and compared with what was written).
func Apply(r Rules) error {
	if r.Mode != ModeNone {
		return fmt.Errorf("firewall mode %q: want %q", r.Mode, ModeNone)
	}
	switch r.Backend {
	case BackendNFTables:
		return applyNFT(r)
	case BackendIPTables:
		if err := applyIPTables(NoneRules(r.AgentPorts), Drop); err != nil {
			return fmt.Errorf("programming the pod firewall with iptables: %w", err)
		}
		return nil
	}
	return fmt.Errorf("firewall backend %q: want %q or %q", r.Backend, BackendNFTables, BackendIPTables)
}

// applyNFT programs r in one netlink batch (all or nothing): table inet
// sbx_pod with an input and an output chain whose policy is drop. Both
// chains accept loopback and ICMPv6 neighbour
// discovery; input accepts TCP to the agent's ports and ICMP errors about
// connections it has; output accepts only the replies of those
// connections (TCP from the agent's ports, conntrack state established).
// So user code reaches nothing off the pod: not the node, other pods,
// services, the API server or the internet, over any protocol.
func applyNFT(r Rules) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("opening nftables: %w", err)
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: Table})
	c.FlushTable(t)
	drop := nftables.ChainPolicyDrop
	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	out := c.AddChain(&nftables.Chain{Name: "output", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	add := func(ch *nftables.Chain, e ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(e, &expr.Verdict{Kind: expr.VerdictAccept})})
	}
	add(in, ifname(expr.MetaKeyIIFNAME, "lo")...)
	add(out, ifname(expr.MetaKeyOIFNAME, "lo")...)
	add(in, neighbourDiscovery()...)
	add(out, neighbourDiscovery()...)
	add(in, ctState(expr.CtStateBitRELATED)...)
	for _, p := range r.AgentPorts {
		add(in, tcpPort(2, p)...)
		add(out, append(tcpPort(0, p), ctState(expr.CtStateBitESTABLISHED)...)...)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("programming the pod firewall with nftables (needs NET_ADMIN in the pod's network namespace; gVisor pods need the iptables backend): %w", err)
	}
	return nil
}

func ifname(key expr.MetaKey, name string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: append([]byte(name), 0)}}
}

// tcpPort matches TCP with source (offset 0) or destination (offset 2)
// port p.
func tcpPort(offset uint32, p uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: offset, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, p)},
	}
}

// ctState matches a conntrack state among bits.
func ctState(bits uint32) []expr.Any {
	mask := make([]byte, 4)
	binary.NativeEndian.PutUint32(mask, bits)
	return []expr.Any{&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)}}
}

// neighbourDiscovery matches ICMPv6 types 133-136 (router and neighbour
// solicitation and advertisement), without which IPv6 on the pod's link
// stops working.
func neighbourDiscovery() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: []byte{133}, ToData: []byte{136}},
	}
}
