package podfw

import (
	"fmt"
	"net/netip"
)

// Direction is which way a Rule's packets travel, seen from the pod.
type Direction uint8

const (
	// In is packets the pod receives (the input hook).
	In Direction = iota + 1
	// Out is packets the pod sends (the output hook).
	Out
)

// Proto is a Rule's transport protocol.
type Proto uint8

const (
	// ProtoAny matches every protocol.
	ProtoAny Proto = iota
	// ProtoTCP matches TCP.
	ProtoTCP
	// ProtoUDP matches UDP.
	ProtoUDP
)

// Verdict is what happens to a packet a Rule matches.
type Verdict uint8

const (
	// Accept lets the packet through.
	Accept Verdict = iota + 1
	// Drop discards it.
	Drop
)

// Rule is one backend-neutral filter rule: a backend lowers a list of
// them, in order (first match wins), into its own rules in front of a
// drop policy. Zero fields match anything.
type Rule struct {
	Dir Direction
	// Iface is the interface the packet arrives on (In) or leaves by
	// (Out); "" = any.
	Iface string
	Proto Proto
	// Remote is the other end's addresses; the zero Prefix is any address
	// of either family, a prefix of one family matches only that family.
	Remote netip.Prefix
	// LocalPort and RemotePort (TCP or UDP only) are the pod's port and the
	// other end's; 0 = any.
	LocalPort, RemotePort uint16
	// Established (TCP only) matches only segments of connections already
	// open, never the SYN that opens one: the replies of connections the
	// other end opened. nftables lowers it to conntrack state established;
	// iptables (no conntrack match in gVisor) to the ACK flag set, which
	// only an opened connection's segments carry (box root cannot forge
	// one: it has no raw sockets).
	Established bool
	Verdict     Verdict
}

// check says what is wrong with r.
func (r Rule) check() error {
	switch {
	case r.Dir != In && r.Dir != Out:
		return fmt.Errorf("rule %+v: direction %d: want in or out", r, r.Dir)
	case r.Verdict != Accept && r.Verdict != Drop:
		return fmt.Errorf("rule %+v: verdict %d: want accept or drop", r, r.Verdict)
	case r.Proto > ProtoUDP:
		return fmt.Errorf("rule %+v: protocol %d: want any, tcp or udp", r, r.Proto)
	case len(r.Iface) > 15:
		return fmt.Errorf("rule %+v: interface name %q longer than 15 bytes", r, r.Iface)
	case r.Proto == ProtoAny && (r.LocalPort != 0 || r.RemotePort != 0):
		return fmt.Errorf("rule %+v: ports need tcp or udp", r)
	case r.Established && r.Proto != ProtoTCP:
		return fmt.Errorf("rule %+v: established needs tcp", r)
	case r.Remote != (netip.Prefix{}) && (!r.Remote.IsValid() || r.Remote != r.Remote.Masked()):
		return fmt.Errorf("rule %+v: remote %s is not a masked prefix", r, r.Remote)
	}
	return nil
}

// NoneRules is mode none as rules (before a drop policy): loopback both
// ways, TCP from anywhere to the agent's ports in and those connections'
// replies out; nothing else. The nftables backend adds what it has
// conntrack for (ICMP errors of those connections) and IPv6 neighbour
// discovery (Apply); the iptables backend enforces exactly these.
func NoneRules(agentPorts []uint16) []Rule {
	rs := []Rule{
		{Dir: In, Iface: "lo", Verdict: Accept},
		{Dir: Out, Iface: "lo", Verdict: Accept},
	}
	for _, p := range agentPorts {
		rs = append(rs,
			Rule{Dir: In, Proto: ProtoTCP, LocalPort: p, Verdict: Accept},
			Rule{Dir: Out, Proto: ProtoTCP, LocalPort: p, Established: true, Verdict: Accept})
	}
	return rs
}
