package network

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// firewall owns the nftables table. Every change is one netlink batch, which
// the kernel applies as one transaction.
type firewall struct {
	params ruleParams

	mu sync.Mutex
	// The fields below are guarded by mu.
	conn  *nftables.Conn
	table *nftables.Table
	maps  map[string]*nftables.Set // in_map, fwd_map
	// egress is the set of boxes whose egress ports go to the proxy.
	egress *nftables.Set
	// learned maps a box's slot name to the addresses its DNS set holds
	// and when each expires there, so that a re-learned address whose
	// element would expire too soon is refreshed (nft does not extend the
	// timeout of an element added again).
	learned map[string]map[netip.Addr]time.Time
}

func newFirewall(name string, p ruleParams) (*firewall, error) {
	conn, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	return &firewall{
		params: p, conn: conn,
		table: &nftables.Table{Name: name, Family: nftables.TableFamilyINet},
	}, nil
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

// rebuild replaces the whole table with the base chains and the rules of
// slots, atomically: used at start and by Cleanup, so whatever a crash left
// in the table is gone in the same transaction that restores the rest.
func (f *firewall) rebuild(slots []*slot) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.conn
	f.learned = nil
	c.AddTable(f.table) // so that the delete below cannot fail
	c.DelTable(f.table)
	c.AddTable(f.table)
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
	f.maps = map[string]*nftables.Set{}
	for _, name := range []string{mapInput, mapForward} {
		s := &nftables.Set{Table: f.table, Name: name, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict, IsMap: true}
		if err := c.AddSet(s, nil); err != nil {
			f.resetLocked()
			return fmt.Errorf("nftables: add map %s: %w", name, err)
		}
		f.maps[name] = s
	}
	f.egress = &nftables.Set{Table: f.table, Name: setEgress, KeyType: nftables.TypeIPAddr}
	if err := c.AddSet(f.egress, nil); err != nil {
		f.resetLocked()
		return fmt.Errorf("nftables: add set %s: %w", setEgress, err)
	}
	// Box chains must exist before the base rules' maps can point at them.
	for _, sl := range slots {
		if sl.IP.IsValid() {
			if err := f.addBoxLocked(sl); err != nil {
				f.resetLocked()
				return err
			}
		}
	}
	for name, rules := range baseRules(f.params) {
		for _, r := range rules {
			c.AddRule(&nftables.Rule{Table: f.table, Chain: chains[name], Exprs: f.exprs(r, nil)})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: build table %s: %w", f.table.Name, err)
	}
	return nil
}

// remove deletes the table (tests, and a daemon told to turn networking off).
func (f *firewall) remove() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.conn.AddTable(f.table)
	f.conn.DelTable(f.table)
	return f.conn.Flush()
}

// addBox installs a box's chains, its DNS set and its map entries.
func (f *firewall) addBox(sl *slot) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.addBoxLocked(sl); err != nil {
		f.resetLocked()
		return err
	}
	if err := f.conn.Flush(); err != nil {
		return fmt.Errorf("nftables: add rules of %s: %w", sl.Owner, err)
	}
	return nil
}

func (f *firewall) addBoxLocked(sl *slot) error {
	c := f.conn
	in := c.AddChain(&nftables.Chain{Name: prefixInChain + sl.Name, Table: f.table})
	fwd := c.AddChain(&nftables.Chain{Name: prefixFwChain + sl.Name, Table: f.table})
	dns := &nftables.Set{Table: f.table, Name: prefixDNSSet + sl.Name, KeyType: nftables.TypeIPAddr, HasTimeout: true}
	if err := c.AddSet(dns, nil); err != nil {
		return fmt.Errorf("nftables: add set: %w", err)
	}
	f.addBoxRulesLocked(sl, in, fwd, dns)
	key := sl.IP.AsSlice()
	for name, chain := range map[string]string{mapInput: in.Name, mapForward: fwd.Name} {
		el := []nftables.SetElement{{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}}
		if err := c.SetAddElements(f.maps[name], el); err != nil {
			return fmt.Errorf("nftables: add map element: %w", err)
		}
	}
	return f.setEgressLocked(sl.IP, sl.Policy.proxied())
}

// setEgressLocked puts ip in or out of the egress set. Adding an element
// that exists is no error and deleting one that does not is, so a removal
// adds first: the batch is one transaction.
func (f *firewall) setEgressLocked(ip netip.Addr, on bool) error {
	if f.params.proxyPort == 0 {
		return nil
	}
	el := []nftables.SetElement{{Key: ip.AsSlice()}}
	if err := f.conn.SetAddElements(f.egress, el); err != nil {
		return fmt.Errorf("nftables: add egress element: %w", err)
	}
	if !on {
		if err := f.conn.SetDeleteElements(f.egress, el); err != nil {
			return fmt.Errorf("nftables: delete egress element: %w", err)
		}
	}
	return nil
}

func (f *firewall) addBoxRulesLocked(sl *slot, in, fwd *nftables.Chain, dns *nftables.Set) {
	inRules, fwdRules := boxRules(f.params, sl.Policy, dns.Name)
	sets := map[string]*nftables.Set{dns.Name: dns}
	for _, r := range inRules {
		f.conn.AddRule(&nftables.Rule{Table: f.table, Chain: in, Exprs: f.exprs(r, sets)})
	}
	for _, r := range fwdRules {
		f.conn.AddRule(&nftables.Rule{Table: f.table, Chain: fwd, Exprs: f.exprs(r, sets)})
	}
}

// setPolicy swaps a box's rules for those of its (new) policy and forgets
// the addresses its DNS set had learned, in one transaction.
func (f *firewall) setPolicy(sl *slot) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	in := &nftables.Chain{Name: prefixInChain + sl.Name, Table: f.table}
	fwd := &nftables.Chain{Name: prefixFwChain + sl.Name, Table: f.table}
	dns := &nftables.Set{Table: f.table, Name: prefixDNSSet + sl.Name, KeyType: nftables.TypeIPAddr, HasTimeout: true}
	f.conn.FlushChain(in)
	f.conn.FlushChain(fwd)
	f.conn.FlushSet(dns)
	delete(f.learned, sl.Name)
	f.addBoxRulesLocked(sl, in, fwd, dns)
	if err := f.setEgressLocked(sl.IP, sl.Policy.proxied()); err != nil {
		f.resetLocked()
		return err
	}
	if err := f.conn.Flush(); err != nil {
		return fmt.Errorf("nftables: swap rules of %s: %w", sl.Owner, err)
	}
	return nil
}

// removeBox deletes a box's map entries, chains and set in one transaction.
func (f *firewall) removeBox(name string, ip netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.conn
	key := ip.AsSlice()
	for _, m := range []string{mapInput, mapForward} {
		if err := c.SetDeleteElements(f.maps[m], []nftables.SetElement{{Key: key}}); err != nil {
			f.resetLocked()
			return err
		}
	}
	if err := f.setEgressLocked(ip, false); err != nil {
		f.resetLocked()
		return err
	}
	for _, ch := range []string{prefixInChain + name, prefixFwChain + name} {
		chain := &nftables.Chain{Name: ch, Table: f.table}
		c.FlushChain(chain)
		c.DelChain(chain)
	}
	c.DelSet(&nftables.Set{Table: f.table, Name: prefixDNSSet + name})
	delete(f.learned, name)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: remove rules of slot %s: %w", name, err)
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

// allowAddrs adds addresses to a box's DNS set for learnedTimeout(ttl).
func (f *firewall) allowAddrs(name string, addrs []netip.Addr, ttl time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	timeout := learnedTimeout(ttl)
	now := time.Now()
	if f.learned == nil {
		f.learned = map[string]map[netip.Addr]time.Time{}
	}
	known := f.learned[name]
	if known == nil {
		known = map[netip.Addr]time.Time{}
		f.learned[name] = known
	}
	set := &nftables.Set{Table: f.table, Name: prefixDNSSet + name, KeyType: nftables.TypeIPAddr, HasTimeout: true}
	var add, refresh []nftables.SetElement
	for _, a := range addrs {
		exp, ok := known[a]
		switch {
		case ok && exp.After(now) && exp.Sub(now) >= timeout/2:
			continue // still there for long enough
		case ok && exp.After(now):
			refresh = append(refresh, nftables.SetElement{Key: a.AsSlice()})
		}
		add = append(add, nftables.SetElement{Key: a.AsSlice(), Timeout: timeout})
		known[a] = now.Add(timeout)
	}
	for a, exp := range known {
		if !exp.After(now) {
			delete(known, a) // the kernel has dropped it already
		}
	}
	if len(add) == 0 {
		return nil
	}
	if len(refresh) > 0 {
		// Delete and re-add in one transaction: the address stays allowed.
		if err := f.conn.SetDeleteElements(set, refresh); err != nil {
			f.resetLocked()
			return err
		}
	}
	if err := f.conn.SetAddElements(set, add); err != nil {
		f.resetLocked()
		return err
	}
	if err := f.conn.Flush(); err != nil {
		// An element that expired in the kernel a moment before our
		// deadline makes the delete fail: forget what we knew and add.
		for _, el := range refresh {
			delete(known, netip.AddrFrom4([4]byte(el.Key)))
		}
		f.resetLocked()
		if len(refresh) == 0 {
			return err
		}
		return f.allowAddrsRetryLocked(set, add)
	}
	return nil
}

// allowAddrsRetryLocked adds elements without deleting first (f.mu held).
func (f *firewall) allowAddrsRetryLocked(set *nftables.Set, add []nftables.SetElement) error {
	if err := f.conn.SetAddElements(set, add); err != nil {
		f.resetLocked()
		return err
	}
	return f.conn.Flush()
}

// exprs compiles a rule.
func (f *firewall) exprs(r rule, sets map[string]*nftables.Set) []expr.Any {
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
	if r.saddrSet != "" {
		nfproto(unix.NFPROTO_IPV4)
		s := f.egress // the only set matched by source
		e = append(e, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID})
	}
	if r.daddrSet != "" {
		nfproto(unix.NFPROTO_IPV4)
		s := sets[r.daddrSet]
		e = append(e, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID})
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
	if r.saddrVmap != "" {
		m := f.maps[r.saddrVmap]
		nfproto(unix.NFPROTO_IPV4)
		e = append(e, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: m.Name, SetID: m.ID, DestRegister: 0, IsDestRegSet: true})
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
