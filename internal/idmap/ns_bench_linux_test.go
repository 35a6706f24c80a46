package idmap

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/testutil"
)

// BenchmarkBoxNamespace times making a box's user namespace (the helper
// in the box's parent namespace, with limits) against ShiftNamespace, a
// bare namespace from a helper stopped at its exec, which is how the
// box's own was made before it had a parent.
func BenchmarkBoxNamespace(b *testing.B) {
	testutil.RequiresRoot(b)
	alloc, err := NewAllocator("", DefaultPool)
	if err != nil {
		b.Fatal(err)
	}
	owner := b.TempDir()
	r, err := alloc.Allocate(owner)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = alloc.Release(r, owner) })
	exe := testutil.AgentBinary(b)
	b.Run("box", func(b *testing.B) {
		ns := filepath.Join(b.TempDir(), "userns")
		if err := os.WriteFile(ns, nil, 0o600); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if err := BoxNamespace(r, exe, ns, DefaultLimits()); err != nil {
				b.Fatal(err)
			}
			if err := unix.Unmount(ns, unix.MNT_DETACH); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bare", func(b *testing.B) {
		for b.Loop() {
			f, err := ShiftNamespace(r, exe)
			if err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
	})
}
