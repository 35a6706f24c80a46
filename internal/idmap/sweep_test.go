package idmap

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/sbxdev/sbx/internal/testutil"
)

// sweepPool lies above DefaultPool: the real-process test runs a process with
// one of its uids, which must be no box's.
var sweepPool = Pool{First: 3 << 30, Size: 65536, Slots: 8}

// fakeProc writes procDir/<pid>/status with the given Uid and Gid lines.
func fakeProc(t *testing.T, procDir string, pid int, uids, gids string) {
	t.Helper()
	dir := filepath.Join(procDir, fmt.Sprint(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	status := fmt.Sprintf("Name:\tx\nPid:\t%d\nUid:\t%s\nGid:\t%s\nGroups:\t\n", pid, uids, gids)
	if err := os.WriteFile(filepath.Join(dir, "status"), []byte(status), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestSweep: only slots whose owner is gone, that are older than the
// minimum age and that no process holds an id of (any of the four uids or
// gids) are freed.
func TestSweep(t *testing.T) {
	root := t.TempDir()
	a, err := NewAllocator(filepath.Join(root, "idmap"), sweepPool)
	if err != nil {
		t.Fatal(err)
	}
	proc := filepath.Join(root, "proc")
	there := filepath.Join(root, "boxes", "there")
	if err := os.MkdirAll(there, 0o755); err != nil {
		t.Fatal(err)
	}
	gone := func(name string) string { return filepath.Join(root, "gone", name) }
	old := time.Now().Add(-time.Hour)
	type slot struct {
		owner string
		age   time.Time
		proc  func(r Range) (uids, gids string)
		freed bool
	}
	none := func(Range) (string, string) { return "0\t0\t0\t0", "0\t0\t0\t0" }
	slots := []slot{
		{gone("free"), old, none, true},
		{gone("by-euid"), old, func(r Range) (string, string) { return fmt.Sprintf("0\t%d\t0\t0", r.Base+5), "0\t0\t0\t0" }, false},
		{gone("by-fsuid"), old, func(r Range) (string, string) { return fmt.Sprintf("0\t0\t0\t%d", r.Base+r.Size-1), "0\t0\t0\t0" }, false},
		{gone("by-gid"), old, func(r Range) (string, string) {
			return "0\t0\t0\t0", fmt.Sprintf("%d\t%d\t%d\t%d", r.Base, r.Base, r.Base, r.Base)
		}, false},
		{gone("young"), time.Now(), none, false},
		{there, old, none, false},
		// Ids just outside the pool are no slot's. (An id just past a
		// range would be the next slot's, which may be one of these.)
		{gone("outside-ids"), old, func(Range) (string, string) {
			end := sweepPool.First + sweepPool.Size*sweepPool.Slots
			return fmt.Sprintf("%d\t%d\t0\t0", sweepPool.First-1, end), fmt.Sprintf("%d\t0\t0\t0", end)
		}, true},
	}
	ranges := map[string]Range{}
	for i, s := range slots {
		r, err := a.Allocate(s.owner)
		if err != nil {
			t.Fatal(err)
		}
		ranges[s.owner] = r
		idx, _ := sweepPool.index(r)
		if err := os.Chtimes(a.file(idx), s.age, s.age); err != nil {
			t.Fatal(err)
		}
		uids, gids := s.proc(r)
		fakeProc(t, proc, 100+i, uids, gids)
	}
	if err := os.MkdirAll(filepath.Join(proc, "self"), 0o755); err != nil { // not a pid: skipped
		t.Fatal(err)
	}
	freed, err := a.Sweep(proc, SweepMinAge)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(freed)
	var want []string
	for _, s := range slots {
		if s.freed {
			want = append(want, s.owner)
		}
	}
	slices.Sort(want)
	if !slices.Equal(freed, want) {
		t.Errorf("Sweep freed %v, want %v", freed, want)
	}
	for _, s := range slots {
		o, err := a.Owner(ranges[s.owner])
		if err != nil {
			t.Fatal(err)
		}
		if kept := o == s.owner; kept == s.freed {
			t.Errorf("slot of %s: owner after the sweep %q, want freed %v", s.owner, o, s.freed)
		}
	}
}

// TestSweepRealProcess: on the real /proc, a range whose owner is gone is
// kept while a process runs with one of its uids, and freed once it exits.
func TestSweepRealProcess(t *testing.T) {
	testutil.RequiresRoot(t)
	a, err := NewAllocator(t.TempDir(), sweepPool)
	if err != nil {
		t.Fatal(err)
	}
	owner := filepath.Join(t.TempDir(), "gone-box")
	r, err := a.Allocate(owner)
	if err != nil {
		t.Fatal(err)
	}
	idx, _ := sweepPool.index(r)
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(a.file(idx), old, old); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: r.Base + 7, Gid: r.Base + 7}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if freed, err := a.Sweep("", SweepMinAge); err != nil || len(freed) != 0 {
		t.Fatalf("Sweep while uid %d runs: freed %v, %v; want nothing", r.Base+7, freed, err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if freed, err := a.Sweep("", SweepMinAge); err != nil || !slices.Equal(freed, []string{owner}) {
		t.Fatalf("Sweep after it exited: freed %v, %v; want [%s]", freed, err, owner)
	}
	if o, _ := a.Owner(r); o != "" {
		t.Errorf("owner after the sweep: %q, want none", o)
	}
}
