//go:build linux

package oci_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/testsuite"
	"github.com/sbxdev/sbx/internal/testutil"
)

// cgroupFile reads a box's cgroup file from whichever hierarchy has it
// (v1 controller dirs first, then the v2 dir).
func cgroupFile(t *testing.T, dir string, h runtime.Handle, ctrl, name string) string {
	t.Helper()
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup", ctrl, cgroupParent(dir), h.ID, name),
		filepath.Join("/sys/fs/cgroup", cgroupParent(dir), h.ID, name),
	} {
		if b, err := os.ReadFile(p); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	t.Fatalf("no cgroup file %s/%s for box %s", ctrl, name, h.ID)
	return ""
}

// memoryLimits returns the memory limit and memory+swap limit files' values.
func memoryLimits(t *testing.T, dir string, h runtime.Handle) (mem, memsw string) {
	t.Helper()
	if _, err := os.Stat("/sys/fs/cgroup/memory"); err == nil {
		mem = cgroupFile(t, dir, h, "memory", "memory.limit_in_bytes")
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory", cgroupParent(dir), h.ID, "memory.memsw.limit_in_bytes")); err == nil {
			memsw = cgroupFile(t, dir, h, "memory", "memory.memsw.limit_in_bytes")
		}
		return mem, memsw
	}
	return cgroupFile(t, dir, h, "memory", "memory.max"), cgroupFile(t, dir, h, "memory", "memory.swap.max")
}

// diskSize is the size of the box's writable-layer tmpfs and whether it is
// still mounted nosuid,nodev.
func diskSize(t *testing.T, dir string, h runtime.Handle) (int64, bool) {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Join(dir, "boxes", h.ID, "rw"), &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks) * st.Bsize, st.Flags&unix.ST_NOSUID != 0 && st.Flags&unix.ST_NODEV != 0
}

func TestUpdate(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := stateRoot(t)
	d := newDriver(t, dir)
	ctx := context.Background()
	hog := func(h runtime.Handle, mib int) bool {
		t.Helper()
		res := testsuite.MustExec(t, d, h, "/usr/bin/python3", "-c", "a = bytearray("+strconv.Itoa(mib)+"<<20); print('survived')")
		return res.Stdout == "survived\n"
	}

	t.Run("Memory", func(t *testing.T) {
		spec := testsuite.NewSpec("upmem")
		spec.Resources.MemoryBytes = 64 << 20
		h := testsuite.Create(t, d, spec)
		if hog(h, 128) {
			t.Fatalf("a 128 MiB hog survived in a 64 MiB box")
		}
		for _, size := range []int64{256 << 20, 64 << 20, 320 << 20} { // grow, shrink, grow
			if err := d.Update(ctx, h, runtime.Resources{MemoryBytes: size}); err != nil {
				t.Fatalf("Update(memory %d MiB): %v", size>>20, err)
			}
			want := strconv.FormatInt(size, 10)
			if mem, memsw := memoryLimits(t, dir, h); mem != want || (memsw != "" && memsw != want && memsw != "0") {
				t.Errorf("after Update(memory %d MiB): limit %s, memory+swap %s; want %s", size>>20, mem, memsw, want)
			}
			if survived, want := hog(h, 128), size > 128<<20; survived != want {
				t.Errorf("128 MiB hog with a %d MiB limit: survived=%v, want %v", size>>20, survived, want)
			}
		}
	})

	t.Run("MemoryBelowUsageRefused", func(t *testing.T) {
		spec := testsuite.NewSpec("upmemuse")
		spec.Resources.MemoryBytes = 256 << 20
		spec.Resources.DiskBytes = 128 << 20
		spec.Resources.Pids = 100
		h := testsuite.Create(t, d, spec)
		// Files in the tmpfs writable layer are charged to the box and cannot
		// be reclaimed (no swap).
		if res := testsuite.MustExec(t, d, h, "dd", "if=/dev/zero", "of=/tmp/fill", "bs=1M", "count=80"); res.ExitCode != 0 {
			t.Fatalf("dd: %+v", res)
		}
		memBefore, _ := memoryLimits(t, dir, h)
		diskBefore, _ := diskSize(t, dir, h)
		err := d.Update(ctx, h, runtime.Resources{MemoryBytes: 32 << 20, Pids: 50, DiskBytes: 100 << 20, CPUMillis: 500})
		if err == nil || !strings.Contains(err.Error(), "memory limit") {
			t.Fatalf("Update(memory 32 MiB) with 80 MiB in use: got %v, want an error naming the memory limit", err)
		}
		t.Logf("refused: %v", err)
		if mem, _ := memoryLimits(t, dir, h); mem != memBefore {
			t.Errorf("memory limit after refused update = %s, want unchanged %s", mem, memBefore)
		}
		if got := cgroupFile(t, dir, h, "pids", "pids.max"); got != "100" {
			t.Errorf("pids.max after refused update = %s, want unchanged 100", got)
		}
		if got, _ := diskSize(t, dir, h); got != diskBefore {
			t.Errorf("disk size after refused update = %d, want unchanged %d", got, diskBefore)
		}
		if err := testsuite.Hello(ctx, d, h); err != nil {
			t.Errorf("agent after refused update: %v", err)
		}
	})

	t.Run("PidsCPU", func(t *testing.T) {
		h := testsuite.Create(t, d, testsuite.NewSpec("uppids"))
		if err := d.Update(ctx, h, runtime.Resources{Pids: 16, CPUMillis: 250}); err != nil {
			t.Fatalf("Update(pids 16, cpu 250m): %v", err)
		}
		if got := cgroupFile(t, dir, h, "pids", "pids.max"); got != "16" {
			t.Errorf("pids.max = %s, want 16", got)
		}
		if _, err := os.Stat("/sys/fs/cgroup/cpu"); err == nil {
			if q, p := cgroupFile(t, dir, h, "cpu", "cpu.cfs_quota_us"), cgroupFile(t, dir, h, "cpu", "cpu.cfs_period_us"); q != "25000" || p != "100000" {
				t.Errorf("cpu quota/period = %s/%s, want 25000/100000", q, p)
			}
			if got := cgroupFile(t, dir, h, "cpu", "cpu.shares"); got != "256" {
				t.Errorf("cpu.shares = %s, want 256 (a quarter CPU)", got)
			}
			// All boxes together weigh as an eighth of a host process.
			parent, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpu", cgroupParent(dir), "cpu.shares"))
			if got := strings.TrimSpace(string(parent)); got != "128" {
				t.Errorf("boxes' parent cpu.shares = %s, want 128", got)
			}
		} else if got := cgroupFile(t, dir, h, "cpu", "cpu.max"); got != "25000 100000" {
			t.Errorf("cpu.max = %q, want 25000 100000", got)
		}
		testsuite.MustExec(t, d, h, "/bin/sh", "-c", "for i in $(seq 30); do sleep 3 & done 2>/dev/null; wait")
		// On cgroup v1 user code's limit is the box's user cgroup's: half
		// of 16, the rest reserved for the agent (usercgroup.go).
		events := "pids.events"
		if _, err := os.Stat("/sys/fs/cgroup/pids"); err == nil {
			if got := cgroupFile(t, dir, h, "pids", "user/pids.max"); got != "8" {
				t.Errorf("user/pids.max = %s, want 8", got)
			}
			events = "user/pids.events"
		}
		if got := cgroupFile(t, dir, h, "pids", events); got == "max 0" {
			t.Errorf("30 sleeps under pids.max 16: %s = %q, want fork failures", events, got)
		}
		// Fewer than the processes the box runs now: refused. Raise the limit
		// first: dash gives up at its first failed fork, so the storm's shell
		// may have exited before `wait`, leaving its sleeps (orphans of the
		// agent) holding pids for up to 3 s, and with the agent's threads
		// 16 may be too few to start another shell.
		if err := d.Update(ctx, h, runtime.Resources{Pids: 64, CPUMillis: 1000}); err != nil {
			t.Fatalf("Update(pids 64, cpu 1000m): %v", err)
		}
		testsuite.MustExec(t, d, h, "/bin/sh", "-c", "for i in 1 2 3 4; do sleep 30 & done")
		if err := d.Update(ctx, h, runtime.Resources{Pids: 2}); err == nil || !strings.Contains(err.Error(), "pids limit") {
			t.Errorf("Update(pids 2) with 5+ processes: got %v, want an error naming the pids limit", err)
		}
	})

	t.Run("Disk", func(t *testing.T) {
		spec := testsuite.NewSpec("updisk")
		spec.Resources.DiskBytes = 32 << 20
		spec.Resources.MemoryBytes = 512 << 20
		h := testsuite.Create(t, d, spec)
		fill := func(wantMiB int) {
			t.Helper()
			res := testsuite.MustExec(t, d, h, "/bin/sh", "-c", "rm -f /tmp/fill; dd if=/dev/zero of=/tmp/fill bs=1M count=200 2>&1; stat -c %s /tmp/fill")
			if res.ExitCode != 0 || !strings.Contains(res.Stdout, "No space left on device") {
				t.Fatalf("dd of 200 MiB: %+v, want ENOSPC", res)
			}
			lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
			n, _ := strconv.ParseInt(lines[len(lines)-1], 10, 64)
			if n < int64(wantMiB-4)<<20 || n > int64(wantMiB)<<20 {
				t.Errorf("dd stopped at %d bytes, want about %d MiB", n, wantMiB)
			}
		}
		fill(32)
		for _, mib := range []int{96, 16} {
			testsuite.MustExec(t, d, h, "rm", "-f", "/tmp/fill")
			if err := d.Update(ctx, h, runtime.Resources{DiskBytes: int64(mib) << 20}); err != nil {
				t.Fatalf("Update(disk %d MiB): %v", mib, err)
			}
			size, flags := diskSize(t, dir, h)
			if size != int64(mib)<<20 || !flags {
				t.Errorf("writable layer after Update(disk %d MiB): %d bytes, nosuid+nodev=%v", mib, size, flags)
			}
			fill(mib)
		}
		// 16 MiB are in use now: shrinking to 8 MiB is refused, nothing changes.
		err := d.Update(ctx, h, runtime.Resources{DiskBytes: 8 << 20, Pids: 77})
		if err == nil || !strings.Contains(err.Error(), "disk limit") {
			t.Fatalf("Update(disk 8 MiB) with 16 MiB used: got %v, want an error naming the disk limit", err)
		}
		t.Logf("refused: %v", err)
		if size, _ := diskSize(t, dir, h); size != 16<<20 {
			t.Errorf("disk size after refused update = %d, want 16 MiB", size)
		}
		if got := cgroupFile(t, dir, h, "pids", "pids.max"); got == "77" {
			t.Errorf("pids.max changed by a refused update")
		}
		if res := testsuite.MustExec(t, d, h, "stat", "-c", "%s", "/tmp/fill"); strings.TrimSpace(res.Stdout) == "0" {
			t.Errorf("file in the writable layer lost")
		}
	})

	t.Run("Paused", func(t *testing.T) {
		h := testsuite.Create(t, d, testsuite.NewSpec("uppause"))
		if err := d.Pause(ctx, h); err != nil {
			t.Fatal(err)
		}
		if err := d.Update(ctx, h, runtime.Resources{MemoryBytes: 128 << 20, Pids: 64, DiskBytes: 48 << 20, CPUMillis: 2000}); err != nil {
			t.Fatalf("Update of a paused box: %v", err)
		}
		if err := d.Resume(ctx, h); err != nil {
			t.Fatal(err)
		}
		if mem, _ := memoryLimits(t, dir, h); mem != strconv.Itoa(128<<20) {
			t.Errorf("memory limit = %s, want 128 MiB", mem)
		}
		if res := testsuite.MustExec(t, d, h, "echo", "ok"); res.Stdout != "ok\n" {
			t.Errorf("echo after update+resume: %+v", res)
		}
	})

	t.Run("Errors", func(t *testing.T) {
		if err := d.Update(ctx, runtime.Handle{ID: "no-such-box"}, runtime.Resources{Pids: 10}); err == nil {
			t.Errorf("Update of an unknown box succeeded")
		}
		h := testsuite.Create(t, d, testsuite.NewSpec("uperr"))
		if err := d.Update(ctx, h, runtime.Resources{}); err != nil {
			t.Errorf("Update with nothing to change: %v", err)
		}
		if err := d.Update(ctx, h, runtime.Resources{Pids: -1}); err == nil {
			t.Errorf("Update with a negative limit succeeded")
		}
	})
	checkNoLeftovers(t, d, dir)
}

// TestCPULimitHolds: the boxes' parent weight and a box's shares only
// order boxes and host when they contend; a 1-CPU box running three busy
// loops still gets at most one CPU.
func TestCPULimitHolds(t *testing.T) {
	testutil.RequiresRoot(t)
	d := newDriver(t, stateRoot(t))
	h := testsuite.Create(t, d, testsuite.NewSpec("cpu1")) // CPUMillis 1000
	st0, err := d.Stats(t.Context(), h)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	testsuite.MustExec(t, d, h, "/bin/sh", "-c", "for i in 1 2 3; do (while :; do :; done) & done; sleep 2; kill $(jobs -p)")
	wall := time.Since(t0)
	st1, err := d.Stats(t.Context(), h)
	if err != nil {
		t.Fatal(err)
	}
	used := time.Duration(st1.CPUUsageNs - st0.CPUUsageNs)
	// One CFS period of slack: the quota is enforced per 100 ms period.
	if used > wall+100*time.Millisecond {
		t.Errorf("a 1-CPU box used %v of CPU in %v", used, wall)
	}
	t.Logf("a 1-CPU box with three busy loops used %v of CPU in %v", used, wall)
}
