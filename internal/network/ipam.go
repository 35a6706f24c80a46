package network

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// slot is one network namespace with, unless its policy is none, a veth and
// an address. Slots are persisted in state.json.
type slot struct {
	// Name names the namespace file, the box's chains and sets: "n" + 10 hex.
	Name string `json:"name"`
	// Owner is the sandbox id; "" while the slot waits in the pool.
	Owner string `json:"owner,omitempty"`
	// IP is the box's address ("" = no veth).
	IP netip.Addr `json:"ip,omitzero"`
	// Veth is the host end's name ("" = no veth).
	Veth string `json:"veth,omitempty"`
	// MAC is the box end's Ethernet address ("" = no veth, or a slot
	// saved before it was recorded: New reads it from the namespace). The
	// port guard lets only it and IP in through Veth.
	MAC    string `json:"mac,omitempty"`
	Policy Policy `json:"policy"`
}

// ipam is the persisted set of slots and the addresses they hold. Not safe
// for concurrent use: the Manager's mu guards it.
type ipam struct {
	path   string
	subnet netip.Prefix
	gw     netip.Addr
	slots  map[string]*slot // by name
	owners map[string]*slot // by owner (slots with one)
	used   map[netip.Addr]string
	// next is where the next address search starts, so freed addresses are
	// not handed out again at once.
	next netip.Addr
}

type ipamFile struct {
	Version int     `json:"version"`
	Next    string  `json:"next,omitempty"`
	Slots   []*slot `json:"slots"`
}

// loadIPAM reads path (a missing file is an empty state).
func loadIPAM(path string, subnet netip.Prefix) (*ipam, error) {
	if !subnet.Addr().Is4() || subnet.Bits() > 30 || subnet.Bits() < 8 {
		return nil, fmt.Errorf("subnet %s: want an IPv4 prefix between /8 and /30: %w", subnet, errdefs.ErrInvalidArgument)
	}
	subnet = subnet.Masked()
	s := &ipam{path: path, subnet: subnet, gw: subnet.Addr().Next(), slots: map[string]*slot{},
		owners: map[string]*slot{}, used: map[netip.Addr]string{}}
	s.next = s.gw.Next()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read network state: %w", err)
	}
	var f ipamFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("parse network state %s: %w", path, err)
	}
	if a, err := netip.ParseAddr(f.Next); err == nil && subnet.Contains(a) {
		s.next = a
	}
	for _, sl := range f.Slots {
		if sl.IP.IsValid() && !subnet.Contains(sl.IP) {
			sl.IP = netip.Addr{} // the subnet changed: Cleanup or Recover re-addresses
		}
		s.slots[sl.Name] = sl
		if sl.Owner != "" {
			// Should a crash have left two slots of one owner, the second
			// is nobody's: Cleanup removes it.
			if _, dup := s.owners[sl.Owner]; !dup {
				s.owners[sl.Owner] = sl
			}
		}
		if sl.IP.IsValid() {
			s.used[sl.IP] = sl.Name
		}
	}
	return s, nil
}

// save writes the state atomically (rename, no fsync: see the package doc).
func (s *ipam) save() error {
	f := ipamFile{Version: 1, Next: s.next.String()}
	for _, sl := range s.slots {
		f.Slots = append(f.Slots, sl)
	}
	b, err := json.MarshalIndent(f, "", " ")
	if err != nil {
		return fmt.Errorf("encode network state: %w", err)
	}
	tmp := s.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write network state: %w", err)
	}
	if err := os.Rename(tmp, s.path); err != nil {
		return fmt.Errorf("write network state: %w", err)
	}
	return nil
}

// newSlot registers a slot with a fresh name (not saved yet).
func (s *ipam) newSlot(owner string, p Policy) *slot {
	b := make([]byte, 5)
	for {
		_, _ = rand.Read(b)
		name := "n" + hex.EncodeToString(b)
		if _, taken := s.slots[name]; !taken {
			sl := &slot{Name: name, Policy: p}
			s.slots[name] = sl
			if owner != "" {
				s.setOwner(sl, owner)
			}
			return sl
		}
	}
}

// assign gives sl an address and a veth name (not saved yet).
func (s *ipam) assign(sl *slot) error {
	if sl.IP.IsValid() {
		return nil
	}
	bcast := lastAddr(s.subnet)
	a := s.next
	for range 1 << (32 - s.subnet.Bits()) {
		if !s.subnet.Contains(a) || a == bcast {
			a = s.gw.Next()
		}
		if _, taken := s.used[a]; !taken && a != s.gw && a != s.subnet.Addr() {
			sl.IP = a
			s.used[a] = sl.Name
			s.next = a.Next()
			// A fresh name each time: the previous veth of the slot may
			// still be being deleted. 13 bytes: fits IFNAMSIZ.
			b := make([]byte, 5)
			_, _ = rand.Read(b)
			sl.Veth = "sbx" + hex.EncodeToString(b)
			sl.MAC = boxMAC(a).String()
			return nil
		}
		a = a.Next()
	}
	return fmt.Errorf("no free address in %s: %w", s.subnet, errdefs.ErrResourceExhausted)
}

// unassign frees sl's address (not saved yet).
func (s *ipam) unassign(sl *slot) {
	if sl.IP.IsValid() && s.used[sl.IP] == sl.Name {
		delete(s.used, sl.IP)
	}
	sl.IP, sl.Veth, sl.MAC = netip.Addr{}, "", ""
}

// unassignLater detaches sl from its address but keeps the address reserved
// (in memory only) until release: its veth is still being deleted. After a
// crash Cleanup deletes such veths before anything is allocated.
func (s *ipam) unassignLater(sl *slot) (netip.Addr, string) {
	ip, veth := sl.IP, sl.Veth
	if ip.IsValid() {
		s.used[ip] = "~" + sl.Name
	}
	sl.IP, sl.Veth, sl.MAC = netip.Addr{}, "", ""
	return ip, veth
}

// release frees an address reserved by unassignLater.
func (s *ipam) release(ip netip.Addr) {
	if strings.HasPrefix(s.used[ip], "~") {
		delete(s.used, ip)
	}
}

// remove forgets sl (not saved yet).
func (s *ipam) remove(sl *slot) {
	s.unassign(sl)
	delete(s.slots, sl.Name)
	if sl.Owner != "" && s.owners[sl.Owner] == sl {
		delete(s.owners, sl.Owner)
	}
}

// setOwner gives sl (a pooled slot, or a new one) to sandbox id (not
// saved yet).
func (s *ipam) setOwner(sl *slot, id string) {
	sl.Owner = id
	s.owners[id] = sl
}

// byOwner finds the slot of a sandbox.
func (s *ipam) byOwner(id string) *slot { return s.owners[id] }

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) | host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// nsPath is where a slot's namespace is bind-mounted.
func nsPath(dir, name string) string { return filepath.Join(dir, "ns", name) }

// boxMAC is the MAC of the box end of the veth with address ip: fixed by
// the address (locally administered, 02:5c + the address), set on the veth
// when it is made and bound to its port by the port guard.
func boxMAC(ip netip.Addr) net.HardwareAddr {
	a := ip.As4()
	return net.HardwareAddr{0x02, 0x5c, a[0], a[1], a[2], a[3]}
}
