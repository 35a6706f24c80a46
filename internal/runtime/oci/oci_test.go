//go:build linux

package oci_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/oci"
	"github.com/sbxdev/sbx/internal/runtime/testsuite"
	"github.com/sbxdev/sbx/internal/testutil"
)

// stateRoot returns a state dir reachable by the boxes' mapped uid (t.TempDir
// is 0700), removed with its cgroup parent at the end of the test.
func stateRoot(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for p := dir; p != os.TempDir() && p != "/"; p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	state := filepath.Join(dir, "s")
	t.Cleanup(func() {
		for _, p := range cgroupDirs(cgroupParent(state)) {
			if err := os.Remove(p); err != nil {
				t.Errorf("remove test cgroup parent: %v", err)
			}
		}
	})
	return state
}

// cgroupParent gives each test state dir its own cgroup parent, so that
// Cleanup in one test never touches boxes of another (or of a daemon).
func cgroupParent(stateDir string) string {
	h := fnv.New32a()
	h.Write([]byte(stateDir))
	return fmt.Sprintf("sbx-test-%08x", h.Sum32())
}

// cgroupDirs lists the existing directories /sys/fs/cgroup/{*/,}<rel>.
func cgroupDirs(rel string) []string {
	m1, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", rel))
	m2, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", rel))
	var dirs []string
	for _, p := range append(m1, m2...) {
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			dirs = append(dirs, p)
		}
	}
	return dirs
}

func newDriver(t testing.TB, stateDir string) *oci.Driver {
	t.Helper()
	return newDriverOn(t, stateDir, "")
}

// newDriverOn is newDriver with the OCI runtime at runtimePath ("" = the
// driver's pick).
func newDriverOn(t testing.TB, stateDir, runtimePath string) *oci.Driver {
	t.Helper()
	d, err := oci.New(oci.Config{StateDir: stateDir, AgentPath: testutil.AgentBinary(t), CgroupParent: cgroupParent(stateDir),
		RuntimePath: runtimePath})
	if err != nil {
		t.Fatalf("oci.New: %v", err)
	}
	return d
}

func TestConformance(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := stateRoot(t)
	var once sync.Once
	var first *oci.Driver
	testsuite.Run(t, testsuite.Config{
		NewDriver: func(t *testing.T) runtime.Driver {
			d := newDriver(t, dir)
			once.Do(func() { first = d })
			return d
		},
		// Handles before versions: today's fields, no "v".
		LegacyHandle: testsuite.Unversioned,
	})
	checkNoLeftovers(t, first, dir)
}

// TestConformanceRunc runs the suite on runc where the driver picks crun
// (TestConformance covers runc elsewhere): runc stays the driver's
// fallback, on hosts without crun or where crun cannot hold the limits.
func TestConformanceRunc(t *testing.T) {
	testutil.RequiresRoot(t)
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("runc not installed")
	}
	dir := stateRoot(t)
	if detail := newDriver(t, dir).Info(context.Background()).Detail; !strings.HasPrefix(detail, "crun ") {
		t.Skipf("the driver picks %q here: TestConformance runs on it", detail)
	}
	var once sync.Once
	var first *oci.Driver
	testsuite.Run(t, testsuite.Config{
		NewDriver: func(t *testing.T) runtime.Driver {
			d := newDriverOn(t, dir, "runc")
			once.Do(func() { first = d })
			return d
		},
		LegacyHandle: testsuite.Unversioned,
	})
	checkNoLeftovers(t, first, dir)
}
