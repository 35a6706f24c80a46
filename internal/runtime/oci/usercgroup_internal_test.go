//go:build linux

package oci

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sbxdev/sbx/internal/runtime"
)

// fakeCgroupfs builds a cgroupLayout over plain directories under a temp
// dir: v1 controllers each in a hierarchy of their own, and a unified
// (cgroup2) hierarchy if unified. Each box cgroup dir gets the files the
// kernel would show, empty, so the code's writes and reads land there.
func fakeCgroupfs(t *testing.T, v1 []string, unified bool) cgroupLayout {
	t.Helper()
	root := t.TempDir()
	l := cgroupLayout{v1: map[string]string{}, parent: "sbx-test"}
	for _, c := range v1 {
		mp := filepath.Join(root, c)
		l.v1[c] = mp
		l.all = append(l.all, mp)
	}
	if unified {
		l.unified = filepath.Join(root, "unified")
		l.all = append(l.all, l.unified)
	}
	return l
}

// box makes box id's cgroup dir in every hierarchy with the kernel's files
// (as runc would leave them); in v1 memory and pids, also the files of a
// user cgroup once its dir exists (the kernel makes them with the dir).
func (l cgroupLayout) fakeBox(t *testing.T, id string) {
	t.Helper()
	files := map[string][]string{
		"memory":  {"memory.limit_in_bytes", "memory.oom_control", "memory.usage_in_bytes", "tasks"},
		"pids":    {"pids.max", "pids.current", "tasks"},
		"unified": {"memory.max", "memory.events", "memory.events.local", "pids.max", "cgroup.procs", "cgroup.subtree_control"},
	}
	for _, dir := range l.dirs(id) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		kind := filepath.Base(filepath.Dir(filepath.Dir(dir)))
		for _, f := range files[kind] {
			if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestUserCgroupLayout: which hierarchies get a user cgroup, what is made
// and written there, and where the agent's own OOM kills are read, on a v1
// host (this machine's), a pure cgroup v2 host and hybrids. On v2 no user
// cgroup is made (the agent is not yet protected there; see usercgroup.go)
// and nothing v1-only is written or opened: the v2 path stays the plain
// single-cgroup layout, consistent with the spec's --user-cgroup-fd count.
// Only the path building is tested here, on plain directories: the kernel
// side on a real v2 host is not (these machines are hybrid).
func TestUserCgroupLayout(t *testing.T) {
	for _, tc := range []struct {
		name         string
		v1           []string
		unified      bool
		wantCtrls    []string // user cgroups made, in --user-cgroup-fd order
		wantOOMLocal string   // file the agent's own OOM kills are read from
	}{
		{"v1", []string{"memory", "pids", "cpu"}, false, []string{"memory", "pids"}, "memory/sbx-test/sb-1/memory.oom_control"},
		{"hybrid, cgroup2 for hugetlb only (this machine)", []string{"memory", "pids", "cpu"}, true, []string{"memory", "pids"}, "memory/sbx-test/sb-1/memory.oom_control"},
		{"hybrid, pids on cgroup2", []string{"memory", "cpu"}, true, []string{"memory"}, "memory/sbx-test/sb-1/memory.oom_control"},
		{"pure v2", nil, true, nil, "unified/sbx-test/sb-1/memory.events.local"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := fakeCgroupfs(t, tc.v1, tc.unified)
			if got := l.userCgroupControllers(); !slices.Equal(got, tc.wantCtrls) {
				t.Fatalf("userCgroupControllers() = %v, want %v", got, tc.wantCtrls)
			}
			// The user cgroup dirs appear with their kernel files as
			// soon as makeUserCgroups makes them: pre-make those files
			// by making the dirs first where the test expects them.
			l.fakeBox(t, "sb-1")
			for _, c := range tc.wantCtrls {
				dir := filepath.Join(l.v1[c], l.parent, "sb-1", userCgroup)
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				for _, f := range []string{"memory.limit_in_bytes", "memory.oom_control", "pids.max", "tasks"} {
					if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			r := runtime.Resources{MemoryBytes: 256 << 20, Pids: 100}
			files, err := l.makeUserCgroups("sb-1", r, false)
			if err != nil {
				t.Fatalf("makeUserCgroups: %v", err)
			}
			var opened []string
			for _, f := range files {
				opened = append(opened, f.Name())
				f.Close()
			}
			var wantOpened []string
			for _, c := range tc.wantCtrls {
				wantOpened = append(wantOpened, filepath.Join(l.v1[c], l.parent, "sb-1", userCgroup, "tasks"))
			}
			if !slices.Equal(opened, wantOpened) {
				t.Errorf("opened for the agent: %v, want %v", opened, wantOpened)
			}
			want := map[string]string{"memory": "memory.limit_in_bytes=234881024", "pids": "pids.max=68"}
			for _, c := range tc.wantCtrls {
				file, val, _ := strings.Cut(want[c], "=")
				b, _ := os.ReadFile(filepath.Join(l.v1[c], l.parent, "sb-1", userCgroup, file))
				if string(b) != val {
					t.Errorf("%s user cgroup %s = %q, want %q (the box's less the agent's reserve)", c, file, b, val)
				}
			}
			// Nothing made or written in a cgroup2 box dir.
			if tc.unified {
				dir := filepath.Join(l.unified, l.parent, "sb-1")
				if _, err := os.Stat(filepath.Join(dir, userCgroup)); !os.IsNotExist(err) {
					t.Errorf("a user cgroup was made on cgroup2 (%v): the agent would need to be moved to a leaf first", err)
				}
				for _, f := range []string{"memory.max", "pids.max", "cgroup.procs", "cgroup.subtree_control"} {
					if b, _ := os.ReadFile(filepath.Join(dir, f)); len(b) != 0 {
						t.Errorf("cgroup2 %s written: %q", f, b)
					}
				}
			}
			// The agent's own OOM kills are read where the agent is.
			oomFile := filepath.Join(filepath.Dir(l.all[0]), tc.wantOOMLocal)
			content := "oom_kill 3\n"
			if err := os.WriteFile(oomFile, []byte("oom_kill_disable 0\nunder_oom 0\n"+content), 0o644); err != nil {
				t.Fatal(err)
			}
			if got := l.ownOOMKills("sb-1"); got != 3 {
				t.Errorf("ownOOMKills = %d, want 3 read from %s", got, tc.wantOOMLocal)
			}
		})
	}
}
