package podfw

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Apply programs r in the current network namespace with r's backend:
// nftables (applyNFT) or iptables (mode none only: the IPv4 and IPv6
// filter tables replaced with NoneRules in front of a drop policy, FORWARD
// dropping everything, each read back and compared with what was written).
func Apply(r Rules) error {
	if r.Mode != ModeNone && r.Mode != ModePublic && r.Mode != ModeAllow {
		return fmt.Errorf("firewall mode %q: want %q, %q or %q", r.Mode, ModeNone, ModePublic, ModeAllow)
	}
	switch r.Backend {
	case BackendNFTables:
		return applyNFT(r)
	case BackendIPTables:
		if r.Mode != ModeNone {
			return fmt.Errorf("firewall mode %q: the %s backend takes %q only", r.Mode, BackendIPTables, ModeNone)
		}
		if err := applyIPTables(NoneRules(r.AgentPorts), Drop); err != nil {
			return fmt.Errorf("programming the pod firewall with iptables: %w", err)
		}
		return nil
	}
	return fmt.Errorf("firewall backend %q: want %q or %q", r.Backend, BackendNFTables, BackendIPTables)
}

// applyNFT programs r (with WithPodFacts of the current pod, in the
// connected modes): table inet sbx_pod with an input and an output chain
// whose policy is drop, holding r.NFTList(). The table, its chains and the
// first rules go in one netlink batch, the rest in batches of batchRules:
// the chains drop from the first batch on, so a failure part way leaves a
// pod that reaches less, and the init container's failure fails the pod
// before any box code runs. In mode none user code reaches nothing off the
// pod: not the node, other pods, services, the API server or the internet,
// over any protocol.
func applyNFT(r Rules) error {
	if r.Mode != ModeNone {
		f, err := podFacts()
		if err != nil {
			return err
		}
		r = r.WithPodFacts(f)
	}
	return apply(r.NFTList())
}

// batchRules bounds the rules of one netlink batch: the kernel acks each
// rule, echoing it, and the acks must fit the socket's receive buffer (128
// rules of a few matches overflowed the default 208 KiB: ENOBUFS).
const batchRules = 32

func apply(rules []NFTRule) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("opening nftables: %w", err)
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: Table})
	c.FlushTable(t)
	drop := nftables.ChainPolicyDrop
	chains := map[string]*nftables.Chain{
		ChainInput: c.AddChain(&nftables.Chain{Name: ChainInput, Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &drop}),
		ChainOutput: c.AddChain(&nftables.Chain{Name: ChainOutput, Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &drop}),
	}
	for i, r := range rules {
		e, err := lower(r)
		if err != nil {
			return err
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: chains[r.Chain], Exprs: e})
		if (i+1)%batchRules == 0 {
			if err := c.Flush(); err != nil {
				return fmt.Errorf("programming the pod firewall (needs NET_ADMIN in the pod's network namespace): %w", err)
			}
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("programming the pod firewall with nftables (needs NET_ADMIN in the pod's network namespace; gVisor pods need the iptables backend): %w", err)
	}
	return nil
}

// lower turns r into nftables expressions.
func lower(r NFTRule) ([]expr.Any, error) {
	if _, ok := map[string]bool{ChainInput: true, ChainOutput: true}[r.Chain]; !ok {
		return nil, fmt.Errorf("pod firewall rule %s: chain %q", r, r.Chain)
	}
	var e []expr.Any
	if r.Lo {
		key := expr.MetaKeyIIFNAME
		if r.Chain == ChainOutput {
			key = expr.MetaKeyOIFNAME
		}
		e = append(e, ifname(key, "lo")...)
	}
	if r.ND {
		e = append(e, neighbourDiscovery()...)
	}
	if r.IPv6 {
		e = append(e, &expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV6}})
	}
	if r.Remote.IsValid() {
		if !r.Remote.Addr().Is4() {
			return nil, fmt.Errorf("pod firewall rule %s: only IPv4 addresses", r)
		}
		offset := uint32(16) // daddr
		if r.Chain == ChainInput {
			offset = 12 // saddr
		}
		e = append(e, prefixMatch(offset, r.Remote)...)
	}
	switch r.Proto {
	case "":
		if r.SPort != 0 || r.DPort != 0 {
			return nil, fmt.Errorf("pod firewall rule %s: ports without a protocol", r)
		}
	case "tcp", "udp":
		proto := byte(unix.IPPROTO_TCP)
		if r.Proto == "udp" {
			proto = unix.IPPROTO_UDP
		}
		e = append(e, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}})
		if r.SPort != 0 {
			e = append(e, port(0, r.SPort)...)
		}
		if r.DPort != 0 {
			e = append(e, port(2, r.DPort)...)
		}
	default:
		return nil, fmt.Errorf("pod firewall rule %s: protocol %q", r, r.Proto)
	}
	switch r.CtState {
	case "":
	case "related":
		e = append(e, ctState(expr.CtStateBitRELATED)...)
	case "established":
		e = append(e, ctState(expr.CtStateBitESTABLISHED)...)
	case "established,related":
		e = append(e, ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED)...)
	default:
		return nil, fmt.Errorf("pod firewall rule %s: ct state %q", r, r.CtState)
	}
	switch r.Verdict {
	case "accept":
		e = append(e, &expr.Verdict{Kind: expr.VerdictAccept})
	case "drop":
		e = append(e, &expr.Verdict{Kind: expr.VerdictDrop})
	default:
		return nil, fmt.Errorf("pod firewall rule %s: verdict %q", r, r.Verdict)
	}
	return e, nil
}

// prefixMatch matches an IPv4 packet whose address at offset in the
// network header (12 source, 16 destination) is in p.
func prefixMatch(offset uint32, p netip.Prefix) []expr.Any {
	mask := net.CIDRMask(p.Bits(), 32)
	addr := p.Masked().Addr().As4()
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr[:]},
	}
}

// podFacts reads what the pod knows of its cluster (see PodFacts).
func podFacts() (PodFacts, error) {
	f := PodFacts{NodeIP: os.Getenv(EnvNodeIP), ServiceHost: os.Getenv("KUBERNETES_SERVICE_HOST")}
	var err error
	if f.ResolvConf, err = os.ReadFile("/etc/resolv.conf"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return f, fmt.Errorf("reading the pod's resolv.conf: %w", err)
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return f, fmt.Errorf("listing the pod's addresses: %w", err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				bits, _ := n.Mask.Size()
				if ip = ip.Unmap(); ip.Is4() {
					f.Networks = append(f.Networks, netip.PrefixFrom(ip, bits))
				}
			}
		}
	}
	routes, err := os.ReadFile("/proc/net/route")
	if err != nil {
		return f, fmt.Errorf("reading the pod's routes: %w", err)
	}
	f.Gateways = gateways(routes)
	return f, nil
}

// gateways returns the next hops of /proc/net/route's routes (the
// Gateway column: a little-endian hex IPv4 address, 0 for none).
func gateways(table []byte) []netip.Addr {
	var out []netip.Addr
	for i, line := range strings.Split(string(table), "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) < 3 {
			continue
		}
		v, err := strconv.ParseUint(f[2], 16, 32)
		if err != nil || v == 0 {
			continue
		}
		var b [4]byte
		binary.LittleEndian.PutUint32(b[:], uint32(v))
		out = append(out, netip.AddrFrom4(b))
	}
	return out
}

func ifname(key expr.MetaKey, name string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: append([]byte(name), 0)}}
}

// port matches the transport header's source (offset 0) or destination
// (offset 2) port p; a protocol match comes first.
func port(offset uint32, p uint16) []expr.Any {
	return []expr.Any{
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
