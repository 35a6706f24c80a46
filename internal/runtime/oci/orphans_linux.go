//go:build linux

package oci

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// `crun run --detach` forks: the child makes the container and exits after
// its parent has, so it is re-parented to the daemon (a child subreaper,
// see the package doc) and would stay a zombie, one per create. runc leaves
// none. reapRuntimeOrphans reaps them; runtimeProcs makes sure it never
// takes the exit status of a runtime process os/exec is about to wait for.

// runtimeProcs counts the runtime processes this package started and has
// not waited for yet, by pid.
var runtimeProcs = struct {
	// starting is held for reading from a start to its pid's entry in
	// live, and for writing by a scan, so a scan never sees one of them
	// exited but not yet in live; starts do not wait for each other.
	starting sync.RWMutex
	mu       sync.Mutex
	// live holds their pids; guarded by mu.
	live map[int]bool
}{live: map[int]bool{}}

// runTracked runs cmd as cmd.Run does, with its pid in runtimeProcs from
// its start to its reaping.
func runTracked(cmd *exec.Cmd) error {
	runtimeProcs.starting.RLock()
	err := cmd.Start()
	if err == nil {
		runtimeProcs.mu.Lock()
		runtimeProcs.live[cmd.Process.Pid] = true
		runtimeProcs.mu.Unlock()
	}
	runtimeProcs.starting.RUnlock()
	if err != nil {
		return err
	}
	err = cmd.Wait()
	runtimeProcs.mu.Lock()
	delete(runtimeProcs.live, cmd.Process.Pid)
	runtimeProcs.mu.Unlock()
	return err
}

// reapOrphans reaps what the runtime's detached runs left (see
// ociRuntime.orphans), if it leaves any.
func (r *ociRuntime) reapOrphans() {
	if r.orphans {
		reapRuntimeOrphans(r.name)
	}
}

// reapRuntimeOrphans reaps this process's zombie children named name (the
// runtime's binary) that it did not start itself (runtimeProcs). A first
// pass without locks finds whether there is any such zombie at all, so
// that concurrent creates and destroys do not queue on a scan for nothing.
func reapRuntimeOrphans(name string) {
	if len(zombieChildren(name)) == 0 {
		return
	}
	runtimeProcs.starting.Lock()
	defer runtimeProcs.starting.Unlock()
	runtimeProcs.mu.Lock()
	defer runtimeProcs.mu.Unlock()
	for _, pid := range zombieChildren(name) {
		if runtimeProcs.live[pid] {
			continue
		}
		// Still our child (unreaped, its pid cannot be reused): only a
		// zombie is waited for, and WNOHANG never blocks.
		_, _ = unix.Wait4(pid, nil, unix.WNOHANG, nil)
	}
}

// zombieChildren lists this process's children that are zombies named
// name. An orphan goes to any live thread of the subreaper: each thread's
// children are listed under it.
func zombieChildren(name string) []int {
	var out []int
	tasks, _ := filepath.Glob("/proc/self/task/*/children")
	for _, t := range tasks {
		b, _ := os.ReadFile(t)
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && zombieNamed(pid, name) {
				out = append(out, pid)
			}
		}
	}
	return out
}

// zombieNamed reports whether pid is a zombie whose command is name.
func zombieNamed(pid int, name string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open || len(s) < end+3 {
		return false
	}
	return s[open+1:end] == name && s[end+2] == 'Z'
}
