//go:build linux

package gvisor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sbxdev/sbx/internal/runtime/testsuite"
	"github.com/sbxdev/sbx/internal/testutil"
)

// TestMemoryBound: a process allocating past the box's memory limit does not
// get the memory, and the box's remains are cleaned up completely.
//
// Unlike under oci, the limit bounds the sandbox as a whole (gVisor's
// kernel and everything in it share one host cgroup): the host OOM killer
// takes the sandbox, so the whole box dies, not just the hog. See
// docs/DRIVERS.md.
func TestMemoryBound(t *testing.T) {
	testutil.RequiresRoot(t)
	dir, cg := stateRoot(t)
	d := newDriver(t, dir, cg)
	spec := testsuite.NewSpec("mem")
	spec.Resources.MemoryBytes = 128 << 20
	spec.Resources.DiskBytes = 16 << 20
	h := testsuite.Create(t, d, spec)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := testsuite.Exec(ctx, d, h, "python3", "-c", "b = bytearray(400 << 20); b[::4096] = b'x' * len(b[::4096]); print('allocated')")
	if err == nil && (r.ExitCode == 0 || strings.Contains(r.Stdout, "allocated")) {
		t.Errorf("allocating 400 MiB in a 128 MiB box: %+v, want it killed", r)
	}
	t.Logf("hog: result %+v, err %v", r, err)
	if err := d.Destroy(ctx, h); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	checkNoLeftovers(t, dir, cg)
}
