//go:build linux

package gvisor_test

import (
	"fmt"
	"hash/fnv"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/gvisor"
	"github.com/sbxdev/sbx/internal/runtime/testsuite"
	"github.com/sbxdev/sbx/internal/testutil"
)

// runscPath is the runsc scripts/install-runsc.sh built (.tools/runsc), or
// runsc on PATH; tests skip, saying so, without one.
func runscPath(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("SBX_RUNSC"); p != "" {
		return p
	}
	if p, err := filepath.Abs("../../../.tools/runsc"); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		return p
	}
	t.Skip("runsc not found: run scripts/install-runsc.sh (or set SBX_RUNSC)")
	return ""
}

// stateRoot returns a state dir the boxes' gofer (host uid
// idmap.Canonical.Base) can traverse, and a cgroup parent of its own.
func stateRoot(t testing.TB) (dir, cgParent string) {
	t.Helper()
	tmp := t.TempDir()
	for p := tmp; p != os.TempDir() && p != "/"; p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	dir = filepath.Join(tmp, "g")
	h := fnv.New32a()
	h.Write([]byte(dir))
	cgParent = fmt.Sprintf("sbx-gvtest-%08x", h.Sum32())
	t.Cleanup(func() {
		m1, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", cgParent))
		m2, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", cgParent))
		for _, p := range append(m1, m2...) {
			if err := os.Remove(p); err != nil {
				t.Errorf("remove test cgroup parent: %v", err)
			}
		}
	})
	return dir, cgParent
}

func newDriver(t testing.TB, dir, cgParent string) *gvisor.Driver {
	t.Helper()
	d, err := gvisor.New(gvisor.Config{StateDir: dir, RunscPath: runscPath(t), AgentPath: testutil.AgentBinary(t), CgroupParent: cgParent})
	if err != nil {
		t.Fatalf("gvisor.New: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return d
}

func TestConformance(t *testing.T) {
	testutil.RequiresRoot(t)
	runscPath(t)
	dir, cg := stateRoot(t)
	testsuite.Run(t, testsuite.Config{NewDriver: func(t *testing.T) runtime.Driver { return newDriver(t, dir, cg) }})
	checkNoLeftovers(t, dir, cg)
}

// checkNoLeftovers: nothing of any box is left: no mounts under the state
// dir but runsc's own, no box dirs, no runsc state, no cgroups, no
// processes.
func checkNoLeftovers(t *testing.T, dir, cg string) {
	t.Helper()
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mi), "\n") {
		if strings.Contains(line, dir+"/boxes") {
			t.Errorf("mount left behind: %s", line)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "boxes")); len(ents) > 0 {
		t.Errorf("box dirs left behind: %d", len(ents))
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "runsc")); len(ents) > 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("runsc state left behind: %v", names)
	}
	for _, pat := range []string{"/sys/fs/cgroup/*/" + cg + "/*", "/sys/fs/cgroup/" + cg + "/*"} {
		m, _ := filepath.Glob(pat)
		for _, p := range m {
			if fi, err := os.Stat(p); err == nil && fi.IsDir() {
				t.Errorf("cgroup left behind: %s", p)
			}
		}
	}
	out, _ := exec.Command("pgrep", "-f", "runsc.*"+dir).Output()
	if s := strings.TrimSpace(string(out)); s != "" {
		t.Errorf("runsc processes left behind: %s", s)
	}
}
