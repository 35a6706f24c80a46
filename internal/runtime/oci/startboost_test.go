//go:build linux

package oci_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/oci"
	"github.com/sbxdev/sbx/internal/runtime/testsuite"
	"github.com/sbxdev/sbx/internal/testutil"
)

// A box starts at full weight: while the runtime and the agent start, the
// box weighs the most among boxes and the boxes' parent one busy host
// process more than its own weight (an eighth of one), so that creates do
// not crawl on a host with other load or beside busy boxes; once the agent
// is ready, before Create returns, both are back to their own weights.
func TestBoxStartsAtFullWeight(t *testing.T) {
	testutil.RequiresRoot(t)
	if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.shares"); err != nil {
		t.Skip("no cgroup v1 cpu controller (the weights below are v1's cpu.shares)")
	}
	dir := stateRoot(t)
	d := newDriver(t, dir)
	parentShares := func() string {
		b, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpu", cgroupParent(dir), "cpu.shares"))
		return strings.TrimSpace(string(b))
	}
	boxShares := func(id string) string {
		b, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpu", cgroupParent(dir), id, "cpu.shares"))
		return strings.TrimSpace(string(b))
	}
	var startBox, startParent string
	defer oci.OnStarted(func(id string) { startBox, startParent = boxShares(id), parentShares() })()
	spec := testsuite.NewSpec("boost")
	spec.Resources.CPUMillis = 250
	h := testsuite.Create(t, d, spec)
	for _, c := range []struct{ what, got, want string }{
		{"box cpu.shares while it starts", startBox, "262144"},
		{"boxes' parent cpu.shares while one starts", startParent, "1152"},
		{"box cpu.shares once created", boxShares(h.ID), "256"},
		{"boxes' parent cpu.shares once created", parentShares(), "128"},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %q, want %q", c.what, c.got, c.want)
		}
	}
	// A box without a CPU limit gets the kernel's default weight.
	spec = testsuite.NewSpec("boost0")
	spec.Resources.CPUMillis = 0
	h0 := testsuite.Create(t, d, spec)
	if got := boxShares(h0.ID); got != "1024" {
		t.Errorf("box without a cpu limit, cpu.shares once created: got %q, want 1024", got)
	}
	for _, h := range []runtime.Handle{h, h0} {
		if err := d.Destroy(context.Background(), h); err != nil {
			t.Fatal(err)
		}
	}
}

// A daemon killed during a start leaves the boxes' parent lifted: the next
// driver over the same parent puts it back at once, not at its first create.
func TestStartBoostResetAtNew(t *testing.T) {
	testutil.RequiresRoot(t)
	if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.shares"); err != nil {
		t.Skip("no cgroup v1 cpu controller")
	}
	dir := stateRoot(t)
	d := newDriver(t, dir)
	h := testsuite.Create(t, d, testsuite.NewSpec("reset"))
	parent := filepath.Join("/sys/fs/cgroup/cpu", cgroupParent(dir), "cpu.shares")
	if err := os.WriteFile(parent, []byte("5248"), 0); err != nil { // as a kill -9 mid-start leaves it
		t.Fatal(err)
	}
	newDriver(t, dir)
	b, _ := os.ReadFile(parent)
	if got := strings.TrimSpace(string(b)); got != "128" {
		t.Errorf("boxes' parent cpu.shares after a new driver: got %s, want 128", got)
	}
	if err := d.Destroy(context.Background(), h); err != nil {
		t.Fatal(err)
	}
}
