package network

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/sbxdev/sbx/internal/errdefs"
)

func TestIPAMPersistsAndReclaims(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	s, err := loadIPAM(path, pfx("10.9.0.0/29")) // .1 gateway, .2-.6 usable
	if err != nil {
		t.Fatal(err)
	}
	var got []netip.Addr
	for i := range 5 {
		sl := s.newSlot("sb-"+string(rune('a'+i)), Policy{Mode: ModePublic})
		if err := s.assign(sl); err != nil {
			t.Fatalf("assign %d: %v", i, err)
		}
		got = append(got, sl.IP)
	}
	if got[0] != netip.MustParseAddr("10.9.0.2") || got[4] != netip.MustParseAddr("10.9.0.6") {
		t.Errorf("addresses %v, want 10.9.0.2..10.9.0.6", got)
	}
	if err := s.assign(s.newSlot("sb-full", Policy{})); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("assign in a full subnet: got %v, want resource exhausted", err)
	}
	if err := s.save(); err != nil {
		t.Fatal(err)
	}

	// A restart sees the same slots; freed addresses are reused only after
	// the rest of the range.
	s2, err := loadIPAM(path, pfx("10.9.0.0/29"))
	if err != nil {
		t.Fatal(err)
	}
	if len(s2.slots) != 6 {
		t.Fatalf("got %d slots after reload, want 6", len(s2.slots))
	}
	b := s2.byOwner("sb-b")
	if b == nil || b.IP != got[1] || b.Veth == "" || b.Policy.Mode != ModePublic {
		t.Fatalf("slot of sb-b after reload: %+v", b)
	}
	s2.remove(b)
	full := s2.byOwner("sb-full")
	if err := s2.assign(full); err != nil {
		t.Fatal(err)
	}
	if full.IP != got[1] {
		t.Errorf("reclaimed address %v, want %v", full.IP, got[1])
	}
}

func TestIPAMRejectsBadSubnet(t *testing.T) {
	for _, s := range []string{"10.0.0.0/31", "fd00::/64", "10.0.0.0/4"} {
		if _, err := loadIPAM(filepath.Join(t.TempDir(), "x"), pfx(s)); err == nil {
			t.Errorf("subnet %s accepted", s)
		}
	}
}

// BenchmarkIPAMSave measures writing the state file with 1000 slots (it
// is written on every attach and detach).
func BenchmarkIPAMSave(b *testing.B) {
	s, err := loadIPAM(filepath.Join(b.TempDir(), "state.json"), netip.MustParsePrefix("10.213.0.0/16"))
	if err != nil {
		b.Fatal(err)
	}
	for i := range 1000 {
		sl := s.newSlot(fmt.Sprintf("sb-%d", i), Policy{Mode: ModePublic})
		if err := s.assign(sl); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		if err := s.save(); err != nil {
			b.Fatal(err)
		}
	}
}
