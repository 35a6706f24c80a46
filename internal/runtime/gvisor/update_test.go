//go:build linux

package gvisor_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/testsuite"
	"github.com/sbxdev/sbx/internal/testutil"
)

// TestUpdateCgroup: Update writes the box's host cgroup (memory, CPU
// quota, pids plus runsc's allowance of 256) and the new limits read back
// there, on a running and on a paused box; a disk limit below what the box
// uses fails naming it and changes none of the other limits; a hog the old
// memory limit would not hold survives the raised one.
func TestUpdateCgroup(t *testing.T) {
	testutil.RequiresRoot(t)
	dir, cg := stateRoot(t)
	d := newDriver(t, dir, cg)
	ctx := context.Background()
	read := func(h runtime.Handle, names ...string) string {
		t.Helper()
		for _, name := range names {
			for _, p := range []string{filepath.Join("/sys/fs/cgroup", strings.Split(name, ".")[0], cg, h.ID, name),
				filepath.Join("/sys/fs/cgroup", cg, h.ID, name)} {
				if b, err := os.ReadFile(p); err == nil {
					return strings.TrimSpace(string(b))
				}
			}
		}
		t.Fatalf("no cgroup file %v for box %s", names, h.ID)
		return ""
	}
	memLimit := func(h runtime.Handle) string { return read(h, "memory.limit_in_bytes", "memory.max") }
	cpuQuota := func(h runtime.Handle) string {
		q := read(h, "cpu.cfs_quota_us", "cpu.max")
		q, _, _ = strings.Cut(q, " ")
		return q
	}
	hog := func(h runtime.Handle, mib int) bool {
		t.Helper()
		r, err := testsuite.Exec(ctx, d, h, "/usr/bin/python3", "-c", "a = bytearray("+strconv.Itoa(mib)+"<<20); print('survived')")
		return err == nil && r.Stdout == "survived\n"
	}

	spec := testsuite.NewSpec("upcg")
	spec.Resources = runtime.Resources{MemoryBytes: 256 << 20, CPUMillis: 500, Pids: 64, DiskBytes: 64 << 20}
	h := testsuite.Create(t, d, spec)
	if got, want := memLimit(h), strconv.Itoa(256<<20); got != want {
		t.Fatalf("memory limit at create = %s, want %s", got, want)
	}
	for _, tc := range []struct {
		name  string
		r     runtime.Resources
		pause bool
	}{
		{"grow", runtime.Resources{MemoryBytes: 512 << 20, CPUMillis: 1500, Pids: 100}, false},
		{"shrink paused", runtime.Resources{MemoryBytes: 384 << 20, CPUMillis: 250, Pids: 80}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.pause {
				if err := d.Pause(ctx, h); err != nil {
					t.Fatal(err)
				}
			}
			if err := d.Update(ctx, h, tc.r); err != nil {
				t.Fatalf("Update(%+v): %v", tc.r, err)
			}
			if tc.pause {
				if err := d.Resume(ctx, h); err != nil {
					t.Fatal(err)
				}
			}
			if got, want := memLimit(h), strconv.FormatInt(tc.r.MemoryBytes, 10); got != want {
				t.Errorf("memory limit = %s, want %s", got, want)
			}
			if got, want := cpuQuota(h), strconv.FormatInt(tc.r.CPUMillis*100, 10); got != want {
				t.Errorf("cpu quota = %s, want %s", got, want)
			}
			if got, want := read(h, "pids.max"), strconv.FormatInt(tc.r.Pids+256, 10); got != want {
				t.Errorf("pids.max = %s, want %s (the limit plus runsc's 256)", got, want)
			}
			if err := testsuite.Hello(ctx, d, h); err != nil {
				t.Errorf("Hello after Update: %v", err)
			}
		})
	}

	t.Run("refused changes nothing", func(t *testing.T) {
		before := [3]string{memLimit(h), cpuQuota(h), read(h, "pids.max")}
		if err := d.Update(ctx, h, runtime.Resources{MemoryBytes: 448 << 20, Pids: -1}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Update with a negative pids limit: got %v, want InvalidArgument", err)
		}
		if r := testsuite.MustExec(t, d, h, "dd", "if=/dev/zero", "of=/tmp/fill", "bs=1M", "count=16"); r.ExitCode != 0 {
			t.Fatalf("writing 16 MiB: %+v", r)
		}
		err := d.Update(ctx, h, runtime.Resources{MemoryBytes: 448 << 20, CPUMillis: 900, Pids: 90, DiskBytes: 8 << 20})
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "disk limit") {
			t.Errorf("Update(disk 8 MiB) with 16 MiB in use: got %v, want FailedPrecondition naming the disk limit", err)
		}
		if after := [3]string{memLimit(h), cpuQuota(h), read(h, "pids.max")}; after != before {
			t.Errorf("memory, cpu quota, pids.max after a refused update = %v, want %v (unchanged)", after, before)
		}
	})

	t.Run("enforced", func(t *testing.T) {
		small := testsuite.NewSpec("upcg2")
		small.Resources.MemoryBytes = 128 << 20
		h2 := testsuite.Create(t, d, small)
		if err := d.Update(ctx, h2, runtime.Resources{MemoryBytes: 768 << 20}); err != nil {
			t.Fatal(err)
		}
		if !hog(h2, 256) {
			t.Errorf("a 256 MiB hog did not survive after raising the memory limit from 128 MiB to 768 MiB")
		}
	})
}
