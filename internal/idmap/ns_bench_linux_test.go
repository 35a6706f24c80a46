package idmap

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/testutil"
)

// BenchmarkBoxNamespace times making a box's user namespace (the helper
// in the box's parent namespace, with limits) against a bare namespace
// from a child stopped at its exec, which is how the box's own was made
// before it had a parent (and, until its parent doubled as it, how the
// namespace idmapped mounts shift through was made).
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
	// The agent as the helper, and the small helper beside it
	// (cmd/sbx-userns-helper, which the oci driver runs when it is there).
	for _, h := range []struct{ name, exe string }{
		{"box", exe}, {"box-small-helper", filepath.Join(filepath.Dir(exe), "sbx-userns-helper")},
	} {
		b.Run(h.name, func(b *testing.B) {
			ns := filepath.Join(b.TempDir(), "userns")
			if err := os.WriteFile(ns, nil, 0o600); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				parent, err := BoxNamespace(r, h.exe, ns, DefaultLimits())
				if err != nil {
					b.Fatal(err)
				}
				parent.Close()
				if err := unix.Unmount(ns, unix.MNT_DETACH); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("bare", func(b *testing.B) {
		m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(r.Base), Size: int(r.Size)}}
		for b.Loop() {
			errc := make(chan error, 1)
			go func() {
				runtime.LockOSThread() // the tracer: never unlocked, the thread ends with the goroutine
				cmd := exec.Command(exe)
				cmd.SysProcAttr = &syscall.SysProcAttr{
					Cloneflags: unix.CLONE_NEWUSER, UidMappings: m, GidMappings: m, Ptrace: true, Pdeathsig: unix.SIGKILL,
				}
				err := cmd.Start()
				if err == nil {
					_ = cmd.Process.Kill()
					_ = cmd.Wait()
				}
				errc <- err
			}()
			if err := <-errc; err != nil {
				b.Fatal(err)
			}
		}
	})
}
