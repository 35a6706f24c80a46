package podfw

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
)

// The iptables backend writes the legacy x_tables ABI (linux/netfilter_ipv4/
// ip_tables.h, netfilter_ipv6/ip6_tables.h, netfilter/x_tables.h,
// xt_tcpudp.h) by hand: a filter table replaced whole with
// IPT_SO_SET_REPLACE / IP6T_SO_SET_REPLACE on a raw socket, then read back
// with IPT_SO_GET_INFO and IPT_SO_GET_ENTRIES. gVisor's netstack implements
// this (pkg/sentry/socket/netfilter), not nftables; Linux does too, which
// the tests use. Sizes are for 64-bit Linux (amd64, arm64).
const (
	iptEntrySize   = 112 // struct ipt_entry
	ip6tEntrySize  = 168 // struct ip6t_entry
	replaceSize    = 96  // struct ipt_replace / ip6t_replace, before the entries
	getinfoSize    = 84  // struct ipt_getinfo
	getEntriesSize = 40  // struct ipt_get_entries, before the entries
	matchHdrSize   = 32  // struct xt_entry_match
	targetHdrSize  = 32  // struct xt_entry_target
	standardSize   = 40  // XT_ALIGN(struct xt_standard_target)
	errorSize      = 64  // XT_ALIGN(struct xt_error_target)
	tcpMatchSize   = 48  // XT_ALIGN(xt_entry_match + struct xt_tcp)
	udpMatchSize   = 48  // XT_ALIGN(xt_entry_match + struct xt_udp)
	counterSize    = 16  // struct xt_counters

	hookIn, hookForward, hookOut = 1, 2, 3 // NF_INET_LOCAL_IN, _FORWARD, _LOCAL_OUT
	filterHooks                  = 1<<hookIn | 1<<hookForward | 1<<hookOut

	verdictAccept = -2 // -NF_ACCEPT - 1
	verdictDrop   = -1 // -NF_DROP - 1

	ip6tFlagProto = 0x01 // IP6T_F_PROTO: the rule checks the protocol
	tcpFlagACK    = 0x10
)

// ipTable is one family's filter table in the x_tables ABI.
type ipTable struct {
	v6        bool
	entries   []byte
	num       uint32
	hookEntry [5]uint32
	underflow [5]uint32
}

// buildTable lowers rules (checked) into family v6's filter table: INPUT
// and OUTPUT hold the rules of their direction and end in policy, FORWARD
// drops everything, then the ERROR entry that ends every table. Rules
// whose Remote is of the other family are left out.
func buildTable(v6 bool, rules []Rule, policy Verdict) (*ipTable, error) {
	for _, r := range rules {
		if err := r.check(); err != nil {
			return nil, err
		}
	}
	if policy != Accept && policy != Drop {
		return nil, fmt.Errorf("policy %d: want accept or drop", policy)
	}
	t := &ipTable{v6: v6}
	for _, chain := range []struct {
		hook int
		dir  Direction
	}{{hookIn, In}, {hookForward, 0}, {hookOut, Out}} {
		t.hookEntry[chain.hook] = uint32(len(t.entries))
		for _, r := range rules {
			if r.Dir != chain.dir || (r.Remote.IsValid() && r.Remote.Addr().Is6() != v6) {
				continue
			}
			t.add(r)
		}
		t.underflow[chain.hook] = uint32(len(t.entries))
		p := policy
		if chain.hook == hookForward {
			p = Drop
		}
		t.add(Rule{Verdict: p})
	}
	t.addError()
	return t, nil
}

func (t *ipTable) entrySize() int {
	if t.v6 {
		return ip6tEntrySize
	}
	return iptEntrySize
}

// add appends r as one entry: its header, its port match, a standard
// target.
func (t *ipTable) add(r Rule) {
	e := make([]byte, t.entrySize())
	ne := binary.NativeEndian
	alen := 4
	if t.v6 {
		alen = 16
	}
	// The IP part: src, dst, smsk, dmsk, iniface, outiface, their masks,
	// proto, then (ip6t: tos,) flags, invflags.
	if r.Remote.IsValid() {
		addr, mask := r.Remote.Addr().AsSlice(), prefixMask(r.Remote)
		if r.Dir == In {
			copy(e[0:], addr)
			copy(e[2*alen:], mask)
		} else {
			copy(e[alen:], addr)
			copy(e[3*alen:], mask)
		}
	}
	ifaces := 4 * alen
	if r.Iface != "" {
		off := ifaces // iniface
		if r.Dir == Out {
			off += 16 // outiface
		}
		copy(e[off:], r.Iface)
		for i := range len(r.Iface) + 1 { // the name and its NUL, as iptables -i/-o does
			e[off+32+i] = 0xff
		}
	}
	protoOff := ifaces + 64
	var proto uint16
	switch r.Proto {
	case ProtoTCP:
		proto = 6
	case ProtoUDP:
		proto = 17
	}
	ne.PutUint16(e[protoOff:], proto)
	if t.v6 && proto != 0 {
		e[protoOff+3] = ip6tFlagProto
	}

	// The port match (struct xt_tcp / xt_udp: spts[2], dpts[2], then
	// tcp: option, flg_mask, flg_cmp, invflags; udp: invflags).
	var match []byte
	if r.Proto != ProtoAny && (r.LocalPort != 0 || r.RemotePort != 0 || r.Established) {
		sp, dp := r.RemotePort, r.LocalPort
		if r.Dir == Out {
			sp, dp = r.LocalPort, r.RemotePort
		}
		size, name := tcpMatchSize, "tcp"
		if r.Proto == ProtoUDP {
			size, name = udpMatchSize, "udp"
		}
		match = make([]byte, size)
		ne.PutUint16(match, uint16(size))
		copy(match[2:], name)
		d := match[matchHdrSize:]
		ne.PutUint16(d[0:], sp) // a port range: p-p, or 0-65535 for any
		ne.PutUint16(d[2:], portRangeEnd(sp))
		ne.PutUint16(d[4:], dp)
		ne.PutUint16(d[6:], portRangeEnd(dp))
		if r.Established {
			d[9], d[10] = tcpFlagACK, tcpFlagACK // flg_mask, flg_cmp
		}
	}

	target := make([]byte, standardSize)
	ne.PutUint16(target, standardSize) // name "" is the standard target
	v := int32(verdictDrop)
	if r.Verdict == Accept {
		v = verdictAccept
	}
	ne.PutUint32(target[targetHdrSize:], uint32(v))

	t.finish(e, match, target)
}

// addError appends the ERROR entry that ends a table (what iptables-restore
// writes; both Linux and gVisor take it as the end).
func (t *ipTable) addError() {
	e := make([]byte, t.entrySize())
	target := make([]byte, errorSize)
	binary.NativeEndian.PutUint16(target, errorSize)
	copy(target[2:], "ERROR")
	copy(target[targetHdrSize:], "ERROR")
	t.finish(e, nil, target)
}

// finish sets the entry's target_offset and next_offset and appends it.
func (t *ipTable) finish(e, match, target []byte) {
	off := iptEntrySize - 24 // after nfcache: target_offset, next_offset
	if t.v6 {
		off = ip6tEntrySize - 28
	}
	binary.NativeEndian.PutUint16(e[off:], uint16(len(e)+len(match)))
	binary.NativeEndian.PutUint16(e[off+2:], uint16(len(e)+len(match)+len(target)))
	t.entries = append(append(append(t.entries, e...), match...), target...)
	t.num++
}

func portRangeEnd(p uint16) uint16 {
	if p == 0 {
		return 0xffff
	}
	return p
}

func prefixMask(p netip.Prefix) []byte {
	m := make([]byte, p.Addr().BitLen()/8)
	for i := range p.Bits() {
		m[i/8] |= 0x80 >> (i % 8)
	}
	return m
}

// replace is the IPT_SO_SET_REPLACE argument: struct ipt_replace, then
// the entries. counters points at room for the old table's counters
// (Linux copies them out; it refuses a num_counters other than the old
// table's number of entries).
func (t *ipTable) replace(oldEntries uint32, counters uintptr) []byte {
	b := make([]byte, replaceSize, replaceSize+len(t.entries))
	ne := binary.NativeEndian
	copy(b, "filter")
	ne.PutUint32(b[32:], filterHooks)
	ne.PutUint32(b[36:], t.num)
	ne.PutUint32(b[40:], uint32(len(t.entries)))
	for i := range 5 {
		ne.PutUint32(b[44+4*i:], t.hookEntry[i])
		ne.PutUint32(b[64+4*i:], t.underflow[i])
	}
	ne.PutUint32(b[84:], oldEntries)
	ne.PutUint64(b[88:], uint64(counters))
	return append(b, t.entries...)
}

// tableInfo is struct ipt_getinfo.
type tableInfo struct {
	validHooks uint32
	hookEntry  [5]uint32
	underflow  [5]uint32
	num, size  uint32
}

func parseInfo(b []byte) tableInfo {
	ne := binary.NativeEndian
	i := tableInfo{validHooks: ne.Uint32(b[32:]), num: ne.Uint32(b[76:]), size: ne.Uint32(b[80:])}
	for h := range 5 {
		i.hookEntry[h] = ne.Uint32(b[36+4*h:])
		i.underflow[h] = ne.Uint32(b[56+4*h:])
	}
	return i
}

// verify compares what the kernel reports (info and the entries IPT_SO_
// GET_ENTRIES returned) with t, byte for byte but for the fields the
// kernel owns (nfcache, comefrom, counters).
func (t *ipTable) verify(info tableInfo, got []byte) error {
	want := tableInfo{validHooks: filterHooks, hookEntry: t.hookEntry, underflow: t.underflow,
		num: t.num, size: uint32(len(t.entries))}
	for h := range 5 { // unused hooks: Linux says 0xffffffff, gVisor 0
		if filterHooks&(1<<h) == 0 {
			info.hookEntry[h], info.underflow[h] = 0, 0
		}
	}
	if info != want {
		return fmt.Errorf("table info: got %+v, want %+v", info, want)
	}
	g, err := t.normalize(got)
	if err != nil {
		return err
	}
	w, err := t.normalize(t.entries)
	if err != nil {
		return err
	}
	if !bytes.Equal(g, w) {
		at := 0
		for at < len(g) && at < len(w) && g[at] == w[at] {
			at++
		}
		return fmt.Errorf("entries differ from what was written at byte %d of %d", at, len(w))
	}
	return nil
}

// normalize copies entries with nfcache, comefrom and counters zeroed.
func (t *ipTable) normalize(entries []byte) ([]byte, error) {
	b := bytes.Clone(entries)
	size := t.entrySize()
	fixed := iptEntrySize - 28 // nfcache
	if t.v6 {
		fixed = ip6tEntrySize - 32
	}
	for off, n := 0, 0; off < len(b); n++ {
		if off+size > len(b) {
			return nil, fmt.Errorf("entry %d at byte %d: truncated", n, off)
		}
		next := int(binary.NativeEndian.Uint16(b[off+fixed+6:]))
		if next < size || off+next > len(b) {
			return nil, fmt.Errorf("entry %d at byte %d: next_offset %d out of range", n, off, next)
		}
		clear(b[off+fixed : off+fixed+4]) // nfcache
		clear(b[off+fixed+8 : off+size])  // comefrom, padding, counters
		off += next
	}
	return b, nil
}
