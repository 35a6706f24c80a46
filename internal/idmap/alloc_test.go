package idmap

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// smallPool has three slots, so exhaustion is cheap to reach.
var smallPool = Pool{First: 1 << 28, Size: 65536, Slots: 3}

func TestPoolCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		pool Pool
		ok   bool
	}{
		{"default", DefaultPool, true},
		{"small", smallPool, true},
		{"ranges too small", Pool{First: 1 << 28, Size: 65535, Slots: 3}, false},
		{"no ranges", Pool{First: 1 << 28, Size: 65536}, false},
		{"past 32 bits", Pool{First: 1 << 31, Size: 65536, Slots: 1 << 15}, false},
		{"ends on the overflow id", Pool{First: 1<<32 - 1 - 65536, Size: 65536, Slots: 1}, false},
		{"overlaps canonical", Pool{First: Canonical.Base + 1000, Size: 65536, Slots: 1}, false},
		{"ends inside canonical", Pool{First: Canonical.Base - 65536 + 1, Size: 65536, Slots: 1}, false},
		{"right below canonical", Pool{First: Canonical.Base - 65536, Size: 65536, Slots: 1}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.pool.check()
			if tc.ok && err != nil {
				t.Fatalf("check: %v, want nil", err)
			}
			if !tc.ok && !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("check: %v, want InvalidArgument", err)
			}
		})
	}
}

func TestRange(t *testing.T) {
	r := Range{Base: 10, Size: 5}
	for id, want := range map[uint32]bool{9: false, 10: true, 14: true, 15: false} {
		if got := r.Contains(id); got != want {
			t.Errorf("%v.Contains(%d) = %v, want %v", r, id, got, want)
		}
	}
	for _, tc := range []struct {
		o    Range
		want bool
	}{
		{Range{Base: 5, Size: 5}, false},
		{Range{Base: 5, Size: 6}, true},
		{Range{Base: 14, Size: 1}, true},
		{Range{Base: 15, Size: 100}, false},
		{Range{Base: 0, Size: 1<<32 - 1}, true},
	} {
		if got := r.Overlaps(tc.o); got != tc.want {
			t.Errorf("%v.Overlaps(%v) = %v, want %v", r, tc.o, got, tc.want)
		}
	}
	if got, want := (Range{Base: 1<<32 - 65536, Size: 65536}).String(), "4294901760-4294967295"; got != want {
		t.Errorf("String = %q, want %q (no 32-bit overflow)", got, want)
	}
}

func TestPoolIndex(t *testing.T) {
	for i := uint32(0); i < smallPool.Slots; i++ {
		got, err := smallPool.index(smallPool.slot(i))
		if err != nil || got != i {
			t.Errorf("index(slot(%d)) = %d, %v", i, got, err)
		}
	}
	for _, r := range []Range{
		{Base: smallPool.First + 1, Size: smallPool.Size},                  // not on a boundary
		{Base: smallPool.First, Size: smallPool.Size + 1},                  // wrong size
		{Base: smallPool.First - smallPool.Size, Size: smallPool.Size},     // below the pool
		{Base: smallPool.slot(smallPool.Slots).Base, Size: smallPool.Size}, // past the last slot
		Canonical,
	} {
		if _, err := smallPool.index(r); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("index(%v): %v, want InvalidArgument", r, err)
		}
	}
}

func TestAllocatorLifecycle(t *testing.T) {
	dir := t.TempDir()
	a, err := NewAllocator(dir, smallPool)
	if err != nil {
		t.Fatal(err)
	}
	got := map[Range]string{}
	for i := range smallPool.Slots {
		owner := fmt.Sprintf("/data/boxes/b%d", i)
		r, err := a.Allocate(owner)
		if err != nil {
			t.Fatalf("allocate %d: %v", i, err)
		}
		if _, dup := got[r]; dup {
			t.Fatalf("range %v handed out twice", r)
		}
		if _, err := smallPool.index(r); err != nil {
			t.Fatalf("allocated %v: %v", r, err)
		}
		got[r] = owner
	}
	if _, err := a.Allocate("/data/boxes/extra"); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("allocate past the pool: %v, want ResourceExhausted", err)
	}
	for r, owner := range got {
		if o, err := a.Owner(r); err != nil || o != owner {
			t.Fatalf("Owner(%v) = %q, %v; want %q", r, o, err, owner)
		}
	}

	// Held matches the owner dir and what is below it, nothing that merely
	// shares a prefix.
	held, err := a.Held("/data/boxes/b1")
	if err != nil || len(held) != 1 || held["/data/boxes/b1"] == (Range{}) {
		t.Fatalf("Held(/data/boxes/b1) = %v, %v; want just b1", held, err)
	}
	if held, _ := a.Held("/data/boxes/b"); len(held) != 0 {
		t.Fatalf("Held(/data/boxes/b) = %v, want nothing (prefix of a name is not a parent)", held)
	}
	if held, _ := a.Held("/data/boxes/"); len(held) != int(smallPool.Slots) {
		t.Fatalf("Held(/data/boxes/) = %v, want all %d", held, smallPool.Slots)
	}

	// Release by someone else does nothing; by the owner frees the slot.
	var r Range
	for r = range got {
		break
	}
	if err := a.Release(r, "/data/boxes/intruder"); err != nil {
		t.Fatal(err)
	}
	if o, _ := a.Owner(r); o != got[r] {
		t.Fatalf("after a stranger's Release, Owner = %q, want %q", o, got[r])
	}
	if err := a.Release(r, got[r]); err != nil {
		t.Fatal(err)
	}
	if o, _ := a.Owner(r); o != "" {
		t.Fatalf("after Release, Owner = %q, want nobody", o)
	}
	if err := a.Release(r, got[r]); err != nil {
		t.Fatalf("second Release: %v, want nil", err)
	}
	again, err := a.Allocate("/data/boxes/next")
	if err != nil || again != r {
		t.Fatalf("allocate after release = %v, %v; want the freed %v", again, err, r)
	}

	// No temporary files are left behind.
	ents, _ := os.ReadDir(dir)
	if len(ents) != int(smallPool.Slots) {
		t.Fatalf("dir holds %d files, want %d slot files", len(ents), smallPool.Slots)
	}
}

func TestAllocatorRefusesBadOwners(t *testing.T) {
	a, err := NewAllocator(t.TempDir(), smallPool)
	if err != nil {
		t.Fatal(err)
	}
	for _, owner := range []string{"", "relative/box", "/box\nother"} {
		if _, err := a.Allocate(owner); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Allocate(%q): %v, want InvalidArgument", owner, err)
		}
	}
	if _, err := a.Owner(Canonical); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Owner(canonical): %v, want InvalidArgument", err)
	}
	if _, err := NewAllocator(t.TempDir(), Pool{First: 1, Size: 1, Slots: 1}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("NewAllocator with a bad pool: %v, want InvalidArgument", err)
	}
}

// Two allocators over one dir (two daemons on one host) racing for the last
// slots never hand out one range twice.
func TestAllocatorConcurrentDaemons(t *testing.T) {
	dir := t.TempDir()
	pool := Pool{First: 1 << 28, Size: 65536, Slots: 64}
	var allocs [2]*Allocator
	for i := range allocs {
		a, err := NewAllocator(dir, pool)
		if err != nil {
			t.Fatal(err)
		}
		allocs[i] = a
	}
	var mu sync.Mutex
	taken := map[Range]string{}
	exhausted := 0
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				owner := fmt.Sprintf("/d%d/g%d/%d", g%2, g, i)
				r, err := allocs[g%2].Allocate(owner)
				mu.Lock()
				if errors.Is(err, errdefs.ErrResourceExhausted) {
					exhausted++
					mu.Unlock()
					return
				}
				if err != nil {
					mu.Unlock()
					t.Errorf("allocate: %v", err)
					return
				}
				if prev, dup := taken[r]; dup {
					t.Errorf("range %v handed to %s and %s", r, prev, owner)
				}
				taken[r] = owner
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(taken) != int(pool.Slots) || exhausted != 8 {
		t.Fatalf("took %d ranges (want %d), %d goroutines saw the pool run out (want 8)", len(taken), pool.Slots, exhausted)
	}
	for r, owner := range taken {
		if o, _ := allocs[0].Owner(r); o != owner {
			t.Fatalf("Owner(%v) = %q, want %q", r, o, owner)
		}
	}
}

// A crash between taking a slot and naming its owner must not leave a slot
// nobody can recognise: the slot file is linked into place already holding
// the owner, and Held sweeps old temporary files.
func TestAllocatorCrashLeftovers(t *testing.T) {
	dir := t.TempDir()
	a, err := NewAllocator(dir, smallPool)
	if err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, tmpPrefix+"crashed")
	fresh := filepath.Join(dir, tmpPrefix+"inflight")
	for _, p := range []string{stale, fresh} {
		if err := os.WriteFile(p, []byte("/data/boxes/half"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	held, err := a.Held("/data")
	if err != nil || len(held) != 0 {
		t.Fatalf("Held = %v, %v; want nothing (temporary files hold no slot)", held, err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a temporary file an hour old is still there (%v); Held should sweep it", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("a fresh temporary file (another daemon's Allocate in flight) was removed: %v", err)
	}
	for range smallPool.Slots {
		if _, err := a.Allocate("/data/boxes/x"); err != nil {
			t.Fatalf("allocate with leftovers present: %v", err)
		}
	}
}
