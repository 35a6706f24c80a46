package gvisor_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/sbxdev/sbx/internal/runtime/ocibox"
	"github.com/sbxdev/sbx/internal/runtime/testsuite"
	"github.com/sbxdev/sbx/internal/testutil"
)

// TestBoxesCPUWeight: gvisor boxes together weigh the daemon's boxes CPU
// shares against each host process, as oci boxes do (runsc made their
// parent cgroup with the default weight before: all gvisor boxes as much
// as a busy host process, eight times oci's, competing with the daemon's
// threads at full weight).
func TestBoxesCPUWeight(t *testing.T) {
	testutil.RequiresRoot(t)
	dir, cg := stateRoot(t)
	d := newDriver(t, dir, cg)
	ctx := context.Background()
	spec := testsuite.NewSpec("weighed")
	h, err := d.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), h) })
	parent, v2, ok := ocibox.CPUParentDir(cg)
	if !ok {
		t.Skip("no cpu cgroup controller on this host")
	}
	file, want := "cpu.shares", int64(ocibox.DefaultBoxesCPUShares)
	if v2 {
		file, want = "cpu.weight", int64(ocibox.DefaultBoxesCPUShares)*100/1024
	}
	if got := ocibox.ReadCgroupInt(filepath.Join(parent, file)); got != want {
		t.Errorf("%s of the gvisor boxes' parent cgroup: got %d, want %d", file, got, want)
	}
	if _, err := os.Stat(filepath.Join(parent, spec.ID)); err != nil {
		t.Errorf("the box's cpu cgroup is not under the weighed parent %s: %v", parent, err)
	}
}
