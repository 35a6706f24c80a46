//go:build linux

package oci_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbxdev/sbx/internal/runtime/oci"
)

// checkNoLeftovers fails if anything of any box is left on the host: mounts
// under the state dir, box dirs, runtime state, cgroups under sbx/.
func checkNoLeftovers(t *testing.T, d *oci.Driver, stateDir string) {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mi), "\n") {
		if strings.Contains(line, stateDir+"/") {
			t.Errorf("mount left behind: %s", line)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(stateDir, "boxes")); len(ents) > 0 {
		t.Errorf("box dirs left behind: %v", names(ents))
	}
	rts, _ := filepath.Glob(filepath.Join(stateDir, "runtime", "*", "*"))
	if len(rts) > 0 {
		t.Errorf("runtime state left behind: %v", rts)
	}
	if dirs := cgroupDirs(filepath.Join(cgroupParent(stateDir), "*")); len(dirs) > 0 {
		t.Errorf("cgroups left behind: %v", dirs)
	}
}

func names(ents []os.DirEntry) []string {
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
