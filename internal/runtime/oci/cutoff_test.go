//go:build linux

package oci_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbxdev/sbx/internal/runtime/testsuite"
	"github.com/sbxdev/sbx/internal/testutil"
)

// TestCrunCreateCutOffLeavesNoCgroups cuts creates on crun off by their
// context at delays spread over `crun run` (a few ms to tens of ms): crun
// makes the container in a detached child of its own, which killing the
// crun the driver started left running; it made the box's cgroups after
// the rollback had removed them (cgroups of the cut-off box were left in
// some hierarchies). Every cut-off box must leave no cgroup in any
// hierarchy and no process.
func TestCrunCreateCutOffLeavesNoCgroups(t *testing.T) {
	testutil.RequiresRoot(t)
	if _, err := exec.LookPath("crun"); err != nil {
		t.Skip("crun not installed")
	}
	dir := stateRoot(t)
	d := newDriverOn(t, dir, "crun")
	var ids []string
	for i := range 40 {
		spec := testsuite.NewSpec(fmt.Sprintf("cut%d", i))
		ids = append(ids, spec.ID)
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(2+i*2)*time.Millisecond)
		h, err := d.Create(ctx, spec)
		cancel()
		if err == nil {
			if err := d.Destroy(context.Background(), h); err != nil {
				t.Fatalf("Destroy: %v", err)
			}
		}
	}
	// Whatever crun process a cut-off left behind would go on making
	// cgroups: wait until no process names this driver's state root (a
	// runtime's argv does: its --root and bundle), then look.
	for deadline := time.Now().Add(30 * time.Second); ; {
		procs := procsNaming(dir)
		if len(procs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("runtime processes of cut-off creates still running after 30 s: %v", procs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var left []string
	for _, id := range ids {
		left = append(left, cgroupDirs(filepath.Join(cgroupParent(dir), id))...)
	}
	if len(left) > 0 {
		t.Errorf("cut-off creates left cgroups:\n  %s", strings.Join(left, "\n  "))
		for _, p := range left {
			_ = removeAll(p)
		}
	}
}

// procsNaming returns the pids of processes whose argv contains s.
func procsNaming(s string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), s) {
			out = append(out, e.Name())
		}
	}
	return out
}

// removeAll removes a leftover cgroup dir so that the test's cleanup can
// remove the parent.
func removeAll(p string) error {
	return exec.Command("rmdir", p).Run()
}
