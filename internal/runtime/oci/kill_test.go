//go:build linux

package oci_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sbxdev/sbx/internal/runtime/testsuite"
	"github.com/sbxdev/sbx/internal/testutil"
)

// TestKillStopsEveryProcess: Kill (runtime.Killer, what the manager does
// before it queues a destroyed box's teardown) ends every process in the
// box's pid namespace, a background child of an exec and a setsid
// double-forked one included, with one signal; a second Kill is no error;
// Destroy then releases the killed box and leaves nothing.
func TestKillStopsEveryProcess(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := stateRoot(t)
	d := newDriver(t, dir)
	h := testsuite.Create(t, d, testsuite.NewSpec("kill"))
	testsuite.MustExec(t, d, h, "sh", "-c", "sleep 600 >/dev/null 2>&1 & setsid sh -c 'sleep 600 >/dev/null 2>&1 &' ")
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
	inBox := func() (n int) {
		procs, _ := filepath.Glob("/proc/[0-9]*")
		for _, p := range procs {
			if ns, err := os.Readlink(p + "/ns/pid"); err == nil && ns == pidns {
				if st, err := os.ReadFile(p + "/stat"); err == nil && !zombie(st) {
					n++
				}
			}
		}
		return n
	}
	if n := inBox(); n < 3 {
		t.Fatalf("processes in the box before Kill: %d, want the agent and both sleeps", n)
	}
	ctx := context.Background()
	if err := d.Kill(ctx, h); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	for deadline := time.Now().Add(30 * time.Second); inBox() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d processes still in the box 30 s after Kill", inBox())
		}
	}
	if err := d.Kill(ctx, h); err != nil {
		t.Errorf("second Kill: %v, want no error", err)
	}
	if err := d.Destroy(ctx, h); err != nil {
		t.Fatalf("Destroy of a killed box: %v", err)
	}
	if left := cgroupDirs(filepath.Join(cgroupParent(dir), h.ID)); len(left) > 0 {
		t.Errorf("cgroups left after Destroy of a killed box: %v", left)
	}
}

// zombie reports whether a /proc/pid/stat line says Z (or X).
func zombie(stat []byte) bool {
	for i := len(stat) - 1; i >= 0; i-- {
		if stat[i] == ')' {
			return i+2 < len(stat) && (stat[i+2] == 'Z' || stat[i+2] == 'X')
		}
	}
	return false
}
