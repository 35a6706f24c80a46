//go:build linux

package oci_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sbxdev/sbx/internal/runtime/testsuite"
	"github.com/sbxdev/sbx/internal/testutil"
)

// TestBoxProcessesInOwnCgroups checks, on each OCI runtime the host has,
// that every process of a box (found by its pid namespace, not by its
// cgroups: the agent and what it started, a background child included) is
// in the box's cgroup, or one below it, in every hierarchy the host
// mounts, v1 and v2: nothing a box runs is charged, or limited, outside
// it, and its cgroup namespace is rooted at its own cgroup everywhere.
func TestBoxProcessesInOwnCgroups(t *testing.T) {
	testutil.RequiresRoot(t)
	for _, rt := range []string{"runc", "crun"} {
		t.Run(rt, func(t *testing.T) {
			if _, err := exec.LookPath(rt); err != nil {
				t.Skipf("%s not installed", rt)
			}
			dir := stateRoot(t)
			d := newDriverOn(t, dir, rt)
			h := testsuite.Create(t, d, testsuite.NewSpec("cgplace"))
			testsuite.MustExec(t, d, h, "sh", "-c", "sleep 60 >/dev/null 2>&1 &")
			var data struct {
				Pid int `json:"pid"`
			}
			if err := json.Unmarshal(h.Data, &data); err != nil || data.Pid == 0 {
				t.Fatalf("handle data %s: no init pid (%v)", h.Data, err)
			}
			pidns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", data.Pid))
			if err != nil {
				t.Fatal(err)
			}
			want := "/" + cgroupParent(dir) + "/" + h.ID
			procs, _ := filepath.Glob("/proc/[0-9]*")
			n := 0
			for _, p := range procs {
				if ns, err := os.Readlink(p + "/ns/pid"); err != nil || ns != pidns {
					continue
				}
				n++
				b, err := os.ReadFile(p + "/cgroup")
				if err != nil {
					continue // exited
				}
				pid, _ := strconv.Atoi(filepath.Base(p))
				for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
					parts := strings.SplitN(line, ":", 3)
					if len(parts) != 3 {
						t.Fatalf("pid %d: cgroup line %q", pid, line)
					}
					if path := parts[2]; path != want && !strings.HasPrefix(path, want+"/") {
						t.Errorf("pid %d (%s) is in cgroup %s of hierarchy %q, want %s or below", pid, comm(pid), path, parts[0]+":"+parts[1], want)
					}
				}
			}
			if n < 2 {
				t.Fatalf("found %d processes in the box's pid namespace, want the agent and its background child", n)
			}
		})
	}
}

func comm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}
