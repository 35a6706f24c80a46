//go:build linux

package oci

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/testutil"
)

// TestRunCmdHidesMountAndKeepsMainThread runs many commands through
// runCmd with a mount to hide: each must not see the mount, and the
// daemon's main thread, whose namespaces /proc/self shows, must keep the
// daemon's mount namespace throughout (a goroutine that changed namespaces
// on it and exited would park it there for good, and hostmount would then
// read another namespace's mounts).
func TestRunCmdHidesMountAndKeepsMainThread(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	if err := unix.Mount("sbx-hide-test", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	orig, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	// Exits 1 if the mount is there.
	script := fmt.Sprintf(`while read -r _ _ _ _ mp _; do [ "$mp" = %q ] && exit 1; done < /proc/self/mountinfo; exit 0`, dir)
	const runs, workers = 200, 8
	var wg sync.WaitGroup
	errs := make(chan error, runs)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < runs; i += workers {
				if err := runCmd(exec.Command("/bin/sh", "-c", script), "", dir); err != nil {
					errs <- fmt.Errorf("run %d: %w", i, err)
				}
				if got, _ := os.Readlink(fmt.Sprintf("/proc/%d/task/%d/ns/mnt", os.Getpid(), os.Getpid())); got != orig {
					errs <- fmt.Errorf("after run %d the main thread's mount namespace is %s, want %s", i, got, orig)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), " "+dir+" ") {
		t.Errorf("/proc/self/mountinfo does not list %s after the runs: the daemon reads another namespace's mounts", dir)
	}
}
