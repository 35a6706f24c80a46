package network

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// firewall owns the nftables table. Its chains and rules are the same
// whatever the number of boxes (baseRules); a box is elements of the
// table's sets, keyed by its address (boxMembership, and the addresses the
// DNS forwarder learned for it). A change is one netlink batch, which the
// kernel applies as one transaction, of at most maxBatchElems elements.
type firewall struct {
	params ruleParams

	mu sync.Mutex
	// The fields below are guarded by mu.
	conn  *nftables.Conn
	table *nftables.Table
	// brTable is the bridge-family table of the same name: the port
	// guard (portguard_linux.go).
	brTable *nftables.Table
	sets    map[string]*nftables.Set
	// boxes is what the sets hold for each box, by slot name.
	boxes map[string]*fwBox
}

// fwBox is one box's part of the table.
type fwBox struct {
	ip netip.Addr
	// veth and mac bind its bridge port to it (the port guard).
	veth string
	mac  net.HardwareAddr
	m    membership
	// learned is the addresses its learned elements hold and when each
	// expires there, so that a re-learned address whose element would
	// expire too soon is refreshed (nft does not extend the timeout of an
	// element added again) and a policy change can delete them.
	learned map[netip.Addr]time.Time
}

// Bounds of one batch. A batch that grew with the number of boxes (the
// first version rebuilt every box's chains and rules in one) overflows the
// netlink socket's buffers: from 15 boxes on the daemon failed at every
// start with ENOBUFS. Elements are sent without echo; the kernel
// acknowledges each message with a few dozen bytes.
const (
	// maxMsgElems bounds one NEWSETELEM/DELSETELEM message: its element
	// list is one attribute, whose length field has 16 bits (64 KiB; a
	// concatenated range element takes about 40 bytes).
	maxMsgElems = 256
	// maxBatchElems bounds the elements of one batch (about 40 KiB,
	// against a socket buffer of 208 KiB by default).
	maxBatchElems = 1024
	// maxLearned bounds the addresses the DNS forwarder may learn for one
	// box at a time: a box that resolves name after name under an allowed
	// wildcard cannot grow the kernel's set (or the daemon's record of it)
	// without end.
	maxLearned = 4096
)

// setOrder lists the table's sets.
var setOrder = []string{setBoxes, setPublic, setEgress, setAPI, setAllow, setDeny, setLearned, setPorts}

// elemOp adds or deletes one element of a set.
type elemOp struct {
	set string
	del bool
	el  nftables.SetElement
}

func newFirewall(name string, p ruleParams) (*firewall, error) {
	conn, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	f := &firewall{
		params: p, conn: conn,
		table:   &nftables.Table{Name: name, Family: nftables.TableFamilyINet},
		brTable: &nftables.Table{Name: name, Family: nftables.TableFamilyBridge},
		boxes:   map[string]*fwBox{},
	}
	ip := nftables.TypeIPAddr
	pair := nftables.MustConcatSetType(ip, ip)
	f.sets = map[string]*nftables.Set{}
	for _, s := range []*nftables.Set{
		{Name: setBoxes, KeyType: ip},
		{Name: setPublic, KeyType: ip},
		{Name: setEgress, KeyType: ip},
		{Name: setAPI, KeyType: ip},
		{Name: setAllow, KeyType: pair, Concatenation: true, Interval: true},
		{Name: setDeny, KeyType: pair, Concatenation: true, Interval: true},
		{Name: setLearned, KeyType: pair, Concatenation: true, HasTimeout: true},
	} {
		s.Table = f.table
		f.sets[s.Name] = s
	}
	f.sets[setPorts] = newPortSet(f.brTable)
	return f, nil
}

func (f *firewall) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	_ = f.conn.CloseLasting()
}

// resetLocked drops messages queued for a batch that will not be sent (a
// lasting connection keeps them until the next Flush).
func (f *firewall) resetLocked() {
	if conn, err := nftables.New(nftables.AsLasting()); err == nil {
		_ = f.conn.CloseLasting()
		f.conn = conn
	}
}

// rebuild replaces the table with the base chains and sets in one
// transaction (whatever a crash left in it is gone), then adds the
// elements of slots in batches of whole boxes. Between the two a box is
// not yet in the boxes set, so its packets are dropped: the table fails
// closed for the milliseconds the batches take. Addresses the DNS
// forwarder had learned for a box in allow mode are kept, with what was
// left of their timeouts.
func (f *firewall) rebuild(slots []*slot) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	kept := f.learnedInTableLocked()
	c := f.conn
	f.boxes = map[string]*fwBox{}
	for _, t := range []*nftables.Table{f.table, f.brTable} {
		c.AddTable(t) // so that the delete below cannot fail
		c.DelTable(t)
		c.AddTable(t)
	}
	accept := nftables.ChainPolicyAccept
	chains := map[string]*nftables.Chain{
		chainInput: c.AddChain(&nftables.Chain{Name: chainInput, Table: f.table, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept}),
		chainForward: c.AddChain(&nftables.Chain{Name: chainForward, Table: f.table, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept}),
		chainPostNAT: c.AddChain(&nftables.Chain{Name: chainPostNAT, Table: f.table, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept}),
		chainPreNAT: c.AddChain(&nftables.Chain{Name: chainPreNAT, Table: f.table, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept}),
	}
	for _, name := range []string{chainFromBox, chainToBox, chainBlocked} {
		chains[name] = c.AddChain(&nftables.Chain{Name: name, Table: f.table})
	}
	for _, name := range setOrder {
		s := f.sets[name]
		s.ID = 0 // a new set in this batch, referred to by its new ID
		if err := c.AddSet(s, nil); err != nil {
			f.resetLocked()
			return fmt.Errorf("nftables: add set %s: %w", name, err)
		}
	}
	for name, rules := range baseRules(f.params) {
		for _, r := range rules {
			c.AddRule(&nftables.Rule{Table: f.table, Chain: chains[name], Exprs: f.exprs(r)})
		}
	}
	f.addPortChainLocked()
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: build table %s: %w", f.table.Name, err)
	}
	// Whole boxes per batch: a box is in it with all of its policy or not
	// at all (one with more elements than a batch holds enters the boxes
	// set in the last of its own batches).
	var batch []elemOp
	now := time.Now()
	for _, sl := range slots {
		if !sl.IP.IsValid() {
			continue
		}
		b := newFwBox(f.params, sl)
		var learned []elemOp
		if sl.Policy.Mode == ModeAllow {
			for _, el := range kept[sl.IP] {
				a := netip.AddrFrom4([4]byte(el.Key[4:8]))
				b.learned[a] = now.Add(el.Expires)
				learned = append(learned, elemOp{set: setLearned, el: nftables.SetElement{Key: el.Key, Timeout: el.Expires}})
			}
		}
		ops := append(append(learned, memberOps(b.ip, membership{}, b.m)...), portOp(b, false), boxOp(b.ip, false))
		if len(batch)+len(ops) > maxBatchElems && len(batch) > 0 {
			if err := f.applyLocked(batch); err != nil {
				return err
			}
			batch = nil
		}
		batch = append(batch, ops...)
		f.boxes[sl.Name] = b
	}
	return f.applyLocked(batch)
}

// learnedInTableLocked returns the elements of the learned set of the
// table as it is, by box address (none if there is no such set: a first
// start, or a table of an older layout).
func (f *firewall) learnedInTableLocked() map[netip.Addr][]nftables.SetElement {
	s, err := f.conn.GetSetByName(f.table, setLearned)
	if err != nil || !s.Concatenation || s.KeyType.Bytes != 8 {
		return nil
	}
	els, err := f.conn.GetSetElements(s)
	if err != nil {
		return nil
	}
	out := map[netip.Addr][]nftables.SetElement{}
	for _, el := range els {
		if len(el.Key) == 8 && el.Expires > 0 {
			box := netip.AddrFrom4([4]byte(el.Key[:4]))
			out[box] = append(out[box], el)
		}
	}
	return out
}

// remove deletes the table (tests, and a daemon told to turn networking off).
func (f *firewall) remove() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, t := range []*nftables.Table{f.table, f.brTable} {
		f.conn.AddTable(t)
		f.conn.DelTable(t)
	}
	return f.conn.Flush()
}

// addrKey is an address as a set key.
func addrKey(a netip.Addr) []byte {
	b := a.As4()
	return b[:]
}

// pairKey is box . a as a concatenated set key.
func pairKey(box, a netip.Addr) []byte { return append(addrKey(box), addrKey(a)...) }

// rangeElem is box . every address of p.
func rangeElem(box netip.Addr, p netip.Prefix) nftables.SetElement {
	return nftables.SetElement{Key: pairKey(box, p.Addr()), KeyEnd: pairKey(box, lastAddr(p))}
}

// memberOps turns the box at ip from membership old into new (the
// boxes set is the caller's): deletions first, then additions.
func memberOps(ip netip.Addr, old, new membership) []elemOp {
	var dels, adds []elemOp
	single := func(set string, was, is bool) {
		switch {
		case was && !is:
			dels = append(dels, elemOp{set: set, del: true, el: nftables.SetElement{Key: addrKey(ip)}})
		case is && !was:
			adds = append(adds, elemOp{set: set, el: nftables.SetElement{Key: addrKey(ip)}})
		}
	}
	ranges := func(set string, was, is []netip.Prefix) {
		inWas, inIs := map[netip.Prefix]bool{}, map[netip.Prefix]bool{}
		for _, p := range was {
			inWas[p] = true
		}
		for _, p := range is {
			inIs[p] = true
		}
		for _, p := range was {
			if !inIs[p] {
				dels = append(dels, elemOp{set: set, del: true, el: rangeElem(ip, p)})
			}
		}
		for _, p := range is {
			if !inWas[p] {
				adds = append(adds, elemOp{set: set, el: rangeElem(ip, p)})
			}
		}
	}
	single(setPublic, old.public, new.public)
	single(setEgress, old.egress, new.egress)
	single(setAPI, old.api, new.api)
	ranges(setAllow, old.allow, new.allow)
	ranges(setDeny, old.deny, new.deny)
	return append(dels, adds...)
}

// newFwBox is the table's record of the box of slot sl, with no learned
// addresses.
func newFwBox(p ruleParams, sl *slot) *fwBox {
	mac, _ := net.ParseMAC(sl.MAC)
	if mac == nil {
		mac = boxMAC(sl.IP)
	}
	return &fwBox{ip: sl.IP, veth: sl.Veth, mac: mac, m: boxMembership(p, sl.Policy), learned: map[netip.Addr]time.Time{}}
}

// boxOp puts ip in or out of the boxes set.
func boxOp(ip netip.Addr, del bool) elemOp {
	return elemOp{set: setBoxes, del: del, el: nftables.SetElement{Key: addrKey(ip)}}
}

// learnedDelsLocked deletes what the DNS forwarder learned for b.
func learnedDelsLocked(b *fwBox) []elemOp {
	ops := make([]elemOp, 0, len(b.learned))
	for a := range b.learned {
		ops = append(ops, elemOp{set: setLearned, del: true, el: nftables.SetElement{Key: pairKey(b.ip, a)}})
	}
	return ops
}

// changeLocked applies ops, which take a box that is in the boxes set
// from one policy to another: in one batch when they fit, else with the
// box out of the boxes set (every packet from it dropped) until the last.
func (f *firewall) changeLocked(ip netip.Addr, ops []elemOp) error {
	if opsCost(ops) > maxBatchElems {
		ops = append(append([]elemOp{boxOp(ip, true)}, ops...), boxOp(ip, false))
	}
	return f.applyLocked(ops)
}

// addBox puts a box's address in the sets its policy says.
func (f *firewall) addBox(sl *slot) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if old := f.boxes[sl.Name]; old != nil {
		return fmt.Errorf("nftables: slot %s is in the table already: %w", sl.Name, errdefs.ErrAlreadyExists)
	}
	return f.addBoxLocked(sl)
}

func (f *firewall) addBoxLocked(sl *slot) error {
	b := newFwBox(f.params, sl)
	// Its boxes element last: until then it has no other effect.
	if err := f.applyLocked(append(memberOps(b.ip, membership{}, b.m), portOp(b, false), boxOp(b.ip, false))); err != nil {
		f.purgeLocked(b, b.m)
		return fmt.Errorf("nftables: add %s: %w", sl.Owner, err)
	}
	f.boxes[sl.Name] = b
	return nil
}

// purgeLocked deletes every element the box at b.ip may have in the sets
// after a change that failed half-way (with membership m as well as its
// recorded one), so that nothing of it is left for a box that gets the
// address later; until it is added again, the box is cut off.
func (f *firewall) purgeLocked(b *fwBox, m membership) {
	ops := append([]elemOp{boxOp(b.ip, true), portOp(b, true)}, learnedDelsLocked(b)...)
	ops = append(ops, memberOps(b.ip, b.m, membership{})...)
	ops = append(ops, memberOps(b.ip, m, membership{})...)
	_ = f.applyLocked(ops) // deleting what is not there is no error
}

// setPolicy moves a box to the sets of its (new) policy and forgets the
// addresses the DNS forwarder had learned for it, in one transaction. A
// box a failed change had cut off is added afresh.
func (f *firewall) setPolicy(sl *slot) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.boxes[sl.Name]
	if b == nil {
		return f.addBoxLocked(sl)
	}
	m := boxMembership(f.params, sl.Policy)
	ops := append(learnedDelsLocked(b), memberOps(b.ip, b.m, m)...)
	if err := f.changeLocked(b.ip, ops); err != nil {
		if opsCost(ops) <= maxBatchElems {
			// One transaction that failed: the old policy stands.
			return fmt.Errorf("nftables: swap policy of %s: %w", sl.Owner, err)
		}
		f.purgeLocked(b, m)
		delete(f.boxes, sl.Name)
		return fmt.Errorf("nftables: swap policy of %s (it is cut off until a change succeeds): %w", sl.Owner, err)
	}
	b.m, b.learned = m, map[netip.Addr]time.Time{}
	return nil
}

// removeBox takes a box's address out of every set, in one transaction
// (its boxes element first, should it need more than one).
func (f *firewall) removeBox(name string) error { return f.removeBoxes([]string{name}) }

// removeBoxes takes the boxes of the named slots out of the table, in
// bounded batches (each box's boxes element first, in the batch that
// deletes the rest of it or an earlier one).
func (f *firewall) removeBoxes(names []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ops []elemOp
	for _, name := range names {
		if b := f.boxes[name]; b != nil {
			ops = append(ops, boxOp(b.ip, true), portOp(b, true))
			ops = append(ops, learnedDelsLocked(b)...)
			ops = append(ops, memberOps(b.ip, b.m, membership{})...)
		}
	}
	if err := f.applyLocked(ops); err != nil {
		return fmt.Errorf("nftables: remove boxes: %w", err)
	}
	for _, name := range names {
		delete(f.boxes, name)
	}
	return nil
}

// applyLocked sends ops in batches of at most maxBatchElems elements, in
// order. A deletion is sent as an addition then a deletion of the same
// element in the same batch, so it cannot fail on an element that is gone
// already (one that expired, or a batch that failed half-way before).
func (f *firewall) applyLocked(ops []elemOp) error {
	start, n := 0, 0
	for i := range ops {
		c := opsCost(ops[i : i+1])
		if n+c > maxBatchElems {
			if err := f.sendLocked(ops[start:i]); err != nil {
				return err
			}
			start, n = i, 0
		}
		n += c
	}
	if start == len(ops) {
		return nil
	}
	return f.sendLocked(ops[start:])
}

// opsCost is how many elements ops send (a deletion is two: see applyLocked).
func opsCost(ops []elemOp) int {
	n := 0
	for _, op := range ops {
		n++
		if op.del {
			n++
		}
	}
	return n
}

// sendLocked sends ops as one batch (one transaction), grouped by set,
// deletions before additions within a set (the order every caller puts
// them in where one element is deleted and added again), so that the batch
// is a handful of messages: the kernel acknowledges each message, and the
// acknowledgements of a message per element overflowed the socket too.
func (f *firewall) sendLocked(ops []elemOp) error {
	rank := func(op elemOp) int {
		r := slices.Index(setOrder, op.set) * 2
		if !op.del {
			r++
		}
		return r
	}
	ops = slices.Clone(ops)
	slices.SortStableFunc(ops, func(a, b elemOp) int { return rank(a) - rank(b) })
	for i := 0; i < len(ops); {
		j := i
		for j < len(ops) && j-i < maxMsgElems && ops[j].set == ops[i].set && ops[j].del == ops[i].del {
			j++
		}
		els := make([]nftables.SetElement, 0, j-i)
		for _, op := range ops[i:j] {
			els = append(els, op.el)
		}
		s := f.sets[ops[i].set]
		err := f.conn.SetAddElements(s, els)
		if err == nil && ops[i].del {
			for k := range els {
				els[k].Timeout = 0
			}
			err = f.conn.SetDeleteElements(s, els)
		}
		if err != nil {
			f.resetLocked()
			return fmt.Errorf("nftables: elements of set %s: %w", s.Name, err)
		}
		i = j
	}
	if err := f.conn.Flush(); err != nil {
		return fmt.Errorf("nftables: update sets of table %s: %w", f.table.Name, err)
	}
	return nil
}

// Learned addresses stay in a box's DNS set for the answer's TTL, but at
// least learnedMin (clients cache answers longer than their TTL, and a
// connection opened just before expiry must still be allowed: established
// flows are accepted by conntrack anyway) and at most learnedMax (an address
// that stops being the name's does not stay reachable forever).
const (
	learnedMin = 5 * time.Minute
	learnedMax = 24 * time.Hour
)

// learnedTimeout is how long an address from an answer with ttl stays.
func learnedTimeout(ttl time.Duration) time.Duration {
	return min(max(ttl, learnedMin), learnedMax)
}

// allowAddrs lets the box of slot name reach addrs for learnedTimeout(ttl):
// elements box . address of the learned set.
func (f *firewall) allowAddrs(name string, addrs []netip.Addr, ttl time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.boxes[name]
	if b == nil {
		return fmt.Errorf("nftables: slot %s is not in the table: %w", name, errdefs.ErrNotFound)
	}
	timeout := learnedTimeout(ttl)
	now := time.Now()
	for a, exp := range b.learned {
		if !exp.After(now) {
			delete(b.learned, a) // the kernel has dropped it already
		}
	}
	// A refresh deletes and re-adds (nft does not extend an element's
	// timeout): in one batch, so the address stays allowed.
	var refresh, add []elemOp
	for _, a := range addrs {
		exp, ok := b.learned[a]
		switch {
		case ok && exp.Sub(now) >= timeout/2:
			continue // still there for long enough
		case ok:
			refresh = append(refresh, elemOp{set: setLearned, del: true, el: nftables.SetElement{Key: pairKey(b.ip, a)}})
		case len(b.learned) >= maxLearned:
			return fmt.Errorf("nftables: slot %s has %d learned addresses, at most %d: %w",
				name, len(b.learned), maxLearned, errdefs.ErrResourceExhausted)
		}
		add = append(add, elemOp{set: setLearned, el: nftables.SetElement{Key: pairKey(b.ip, a), Timeout: timeout}})
		b.learned[a] = now.Add(timeout)
	}
	// On failure the record keeps the addresses: deleting one the set
	// does not hold is no error, forgetting one it holds would leave it
	// allowed after a policy change.
	return f.applyLocked(append(refresh, add...))
}

// exprs compiles a rule.
func (f *firewall) exprs(r rule) []expr.Any {
	var e []expr.Any
	ifname := func(key expr.MetaKey, name string, op expr.CmpOp) {
		e = append(e, &expr.Meta{Key: key, Register: 1},
			&expr.Cmp{Op: op, Register: 1, Data: append([]byte(name), 0)})
	}
	if r.iif != "" {
		ifname(expr.MetaKeyIIFNAME, r.iif, expr.CmpOpEq)
	}
	if r.notIif != "" {
		ifname(expr.MetaKeyIIFNAME, r.notIif, expr.CmpOpNeq)
	}
	if r.oif != "" {
		ifname(expr.MetaKeyOIFNAME, r.oif, expr.CmpOpEq)
	}
	if r.notOif != "" {
		ifname(expr.MetaKeyOIFNAME, r.notOif, expr.CmpOpNeq)
	}
	nfproto := func(p byte) {
		e = append(e, &expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}})
	}
	if r.ipv6 {
		nfproto(unix.NFPROTO_IPV6)
	}
	if r.ctEstRel {
		mask := make([]byte, 4)
		binary.NativeEndian.PutUint32(mask, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED)
		e = append(e, &expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)})
	}
	addr := func(offset uint32, p netip.Prefix) {
		nfproto(unix.NFPROTO_IPV4)
		if p.Bits() == 0 {
			return
		}
		e = append(e, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4})
		if p.Bits() < 32 {
			mask := binary.BigEndian.AppendUint32(nil, ^uint32(0)<<(32-p.Bits()))
			e = append(e, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)})
		}
		e = append(e, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Masked().Addr().AsSlice()})
	}
	if r.saddr.IsValid() {
		addr(12, r.saddr)
	}
	if r.daddr.IsValid() {
		addr(16, r.daddr)
	}
	lookup := func(set string, invert bool) {
		s := f.sets[set]
		e = append(e, &expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID, Invert: invert})
	}
	if r.saddrSet != "" || r.notSaddrSet != "" {
		nfproto(unix.NFPROTO_IPV4)
		e = append(e, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4})
		if r.saddrSet != "" {
			lookup(r.saddrSet, false)
		} else {
			lookup(r.notSaddrSet, true)
		}
	}
	if r.pairSet != "" {
		// saddr . daddr: the first field in register 1, the second in the
		// 32-bit register after it (NFT_REG32_01), as nft itself does.
		nfproto(unix.NFPROTO_IPV4)
		e = append(e, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Payload{DestRegister: unix.NFT_REG32_01, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4})
		lookup(r.pairSet, false)
	}
	if r.l4proto != "" {
		p := byte(unix.IPPROTO_TCP)
		if r.l4proto == "udp" {
			p = unix.IPPROTO_UDP
		}
		e = append(e, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}})
	}
	if r.dport != 0 {
		e = append(e, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, r.dport)})
	}
	if r.masquerade {
		e = append(e, &expr.Masq{})
	}
	if r.redirect != 0 {
		e = append(e, &expr.Immediate{Register: 1, Data: binary.BigEndian.AppendUint16(nil, r.redirect)},
			&expr.Redir{RegisterProtoMin: 1})
	}
	switch v := r.verdict; {
	case v == "accept":
		e = append(e, &expr.Verdict{Kind: expr.VerdictAccept})
	case v == "drop":
		e = append(e, &expr.Verdict{Kind: expr.VerdictDrop})
	case v == "return":
		e = append(e, &expr.Verdict{Kind: expr.VerdictReturn})
	case len(v) > 5 && v[:5] == "jump ":
		e = append(e, &expr.Verdict{Kind: expr.VerdictJump, Chain: v[5:]})
	}
	return e
}
