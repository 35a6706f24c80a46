package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The port guard binds each bridge port to its box: a frame that enters
// the bridge through a box's veth is let in only if it is IPv4 from the
// box's own MAC and address, or ARP from them; everything else (another
// box's address or MAC, ARP claiming a neighbour's address, IPv6, VLAN tags,
// other ethertypes) is dropped before the bridge learns its source MAC and
// before the inet table, which keys every per-box rule on the source
// address, sees it.
//
// The inet table cannot do this: in it a box's packets come in on the
// bridge, not on their port. It lives in a table of the bridge family with
// the inet table's name: one chain on the prerouting hook and one set,
// ports (veth . MAC . address), an element per attached box. The chain
// knows this daemon's ports by their interface group (portGroup, set when
// a veth is made, and on the bridge's ports at start): the bridge
// family's hook sees every bridge of the host, and this kernel has no
// `meta ibrname` (CONFIG_NFT_BRIDGE_META). A port of this daemon's that
// has no element (a pooled namespace, a veth made for a box that is not
// in the table yet) lets nothing in: the guard fails closed.
//
// Under oci a box cannot forge frames (the namespace belongs to the host's
// user namespace: no raw sockets, no address changes); under gvisor user
// code cannot either (runsc --net-raw is off, no CAP_NET_ADMIN in gVisor's
// kernel), but runsc's sandbox process holds an AF_PACKET socket on the
// veth, so code that took over gVisor's kernel could write any frame there.
// Without the guard such a box would take a neighbour's policy (public
// egress, the box API) by using its address, or take its traffic by ARP or
// by teaching the bridge its MAC. The guard holds for every driver that
// attaches a veth, whatever its kernel.

const (
	chainPorts = "ports" // bridge table: the prerouting chain
	setPorts   = "ports" // bridge table: veth . MAC . address per box
)

// peerMAC reads the MAC of eth0 in the namespace at nsFile (boxes made
// before the MAC was fixed by the address have a random one).
func peerMAC(nsFile string) (net.HardwareAddr, error) {
	ns, err := netns.GetFromPath(nsFile)
	if err != nil {
		return nil, fmt.Errorf("open netns: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink in netns: %w", err)
	}
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return nil, fmt.Errorf("look up eth0 in netns: %w", err)
	}
	if len(eth.Attrs().HardwareAddr) != 6 {
		return nil, errors.New("eth0 has no Ethernet address")
	}
	return eth.Attrs().HardwareAddr, nil
}

// portKey is veth . mac . ip as a ports set key (each field padded to a
// multiple of 4 bytes, as the registers hold them).
func portKey(veth string, mac net.HardwareAddr, ip netip.Addr) []byte {
	k := make([]byte, 28)
	copy(k[:unix.IFNAMSIZ], veth)
	copy(k[16:22], mac)
	a := ip.As4()
	copy(k[24:], a[:])
	return k
}

// portOp puts a box's binding in or out of the ports set.
func portOp(b *fwBox, del bool) elemOp {
	return elemOp{set: setPorts, del: del, el: nftables.SetElement{Key: portKey(b.veth, b.mac, b.ip)}}
}

// newPortSet returns the ports set of bridge table t.
func newPortSet(t *nftables.Table) *nftables.Set {
	return &nftables.Set{Table: t, Name: setPorts, Concatenation: true,
		KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeEtherAddr, nftables.TypeIPAddr)}
}

// addPortChainLocked adds the bridge table's chain and rules to the batch
// (its set is added with the others).
func (f *firewall) addPortChainLocked() {
	accept := nftables.ChainPolicyAccept // frames of other bridges
	ch := f.conn.AddChain(&nftables.Chain{Name: chainPorts, Table: f.brTable, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	for _, exprs := range portRules(f.params.bridge, f.sets[setPorts]) {
		f.conn.AddRule(&nftables.Rule{Table: f.brTable, Chain: ch, Exprs: exprs})
	}
}

// portGroup is the interface group of the bridge's ports: derived from
// the bridge's name (never 0, the default group), so daemons on other
// bridges guard only their own ports.
func portGroup(bridge string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(bridge))
	return h.Sum32() | 1<<31
}

// groupPorts puts every port of the bridge in its port group (veths made
// before ports had one).
func groupPorts(bridge string, bridgeIndex int) error {
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	g := portGroup(bridge)
	for _, l := range links {
		if l.Attrs().MasterIndex == bridgeIndex && l.Attrs().Group != g {
			if err := netlink.LinkSetGroup(l, int(g)); err != nil {
				return fmt.Errorf("set group of bridge port %s: %w", l.Attrs().Name, err)
			}
		}
	}
	return nil
}

// portRules are the bridge table's rules:
//
//	meta iifgroup != GROUP return
//	meta protocol ip iifname . ether saddr . ip saddr @ports accept
//	meta protocol arp arp htype 1 ptype ip hlen 6 plen 4
//	    iifname . ether saddr . arp saddr ip @ports
//	    iifname . arp saddr ether . arp saddr ip @ports accept
//	drop
func portRules(bridge string, ports *nftables.Set) [][]expr.Any {
	cmp := func(reg uint32, data []byte) expr.Any { return &expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: data} }
	proto := func(p uint16) []expr.Any {
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: 1}, cmp(1, binary.BigEndian.AppendUint16(nil, p))}
	}
	// lookup checks iifname . MAC at macOff of base . IPv4 at ipOff of the
	// network header against the ports set.
	lookup := func(macBase expr.PayloadBase, macOff, ipOff uint32) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Payload{DestRegister: unix.NFT_REG32_04, Base: macBase, Offset: macOff, Len: 6},
			&expr.Payload{DestRegister: unix.NFT_REG32_06, Base: expr.PayloadBaseNetworkHeader, Offset: ipOff, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: ports.Name, SetID: ports.ID},
		}
	}
	accept := &expr.Verdict{Kind: expr.VerdictAccept}
	ipRule := append(proto(unix.ETH_P_IP), lookup(expr.PayloadBaseLLHeader, 6, 12)...)
	arpRule := append(proto(unix.ETH_P_ARP),
		// Ethernet/IPv4 ARP only: the offsets below depend on it.
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 0, Len: 6},
		cmp(1, []byte{0, 1, 8, 0, 6, 4}))
	arpRule = append(arpRule, lookup(expr.PayloadBaseLLHeader, 6, 14)...)      // ether saddr . arp spa
	arpRule = append(arpRule, lookup(expr.PayloadBaseNetworkHeader, 8, 14)...) // arp sha . arp spa
	return [][]expr.Any{
		{&expr.Meta{Key: expr.MetaKeyIIFGROUP, Register: 1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, portGroup(bridge))},
			&expr.Verdict{Kind: expr.VerdictReturn}},
		append(ipRule, accept),
		append(arpRule, accept),
		{&expr.Verdict{Kind: expr.VerdictDrop}},
	}
}
