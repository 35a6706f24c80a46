//go:build linux

package oci

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/sbxdev/sbx/internal/cleanup"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/ocibox"
)

// The agent and user code in sibling cgroups (attack class 5). User code
// shares the agent's uid and namespaces: it can raise the agent's
// oom_score_adj (raising needs no privilege, lowering back needs
// CAP_SYS_RESOURCE) and then run the box out of memory, or fork until the
// box's pids limit leaves the agent no thread. So every user process lives
// in a child cgroup of the box's, userCgroup, whose memory and pids limits
// are the box's less a reserve for the agent (userMemory, userPids): user
// code's OOM kills are chosen among user processes only, its fork bomb stops
// short of the box's limit, and the agent, in the box's cgroup itself, keeps
// the rest whatever its oom_score_adj says.
//
// cgroup v1 (memory and pids here) cannot place a process in a cgroup at
// fork, and moving each new process costs a cgroup-wide write lock. v1 does
// let a single thread live in another cgroup than its process, and a fork
// inherits the forking thread's cgroups: the agent keeps one locked thread
// in userCgroup (it writes its tid to the `tasks` files the driver opens for
// it, as host root, and passes as inherited fds: the kernel checks the
// opener's credentials) and forks every user process from it. Memory is
// charged by process, so the agent's own memory stays the box cgroup's.
//
// On a controller that is on cgroup v2 the driver makes no user cgroup yet
// (TestUserCgroupLayout pins that: nothing is made, opened or written
// there, and the agent's OOM kills are read from the box cgroup's
// memory.events.local, where it is), so on a pure v2 host the agent is not
// protected (THREAT-MODEL's known gaps). What v2 needs, found while
// checking this path (untested: these machines are hybrid):
//   - memory is not a threaded controller, so no thread of the agent can
//     sit in another memory cgroup than its process: user processes must
//     be placed at fork, with clone3(CLONE_INTO_CGROUP) (Go's
//     SysProcAttr.UseCgroupFD) on an fd of the user cgroup's directory;
//   - a cgroup with controllers in cgroup.subtree_control holds no process,
//     so the agent moves to a leaf of its own (box/agent) before the box's
//     subtree_control gets +memory +pids, and runc must still be given the
//     box's cgroup (its limits cover both leaves);
//   - CLONE_INTO_CGROUP checks the caller's credentials (box root is not
//     host root), write access to cgroup.procs of the destination and of
//     the common ancestor (the box's), and, with nsdelegate (systemd mounts
//     cgroup2 so), that both lie inside the caller's cgroup namespace,
//     whose root is the box's cgroup: the driver must move the agent to
//     box/agent after runc put it in the box's cgroup (so the namespace
//     root stays the box's) and chown box/cgroup.procs and
//     box/user/cgroup.procs (never box/agent's) to the box's root uid;
//     box root could then move the agent into user (harming only itself),
//     never a user process into the agent's leaf.
const userCgroup = "user"

// userControllers are the v1 controllers that get a user cgroup.
var userControllers = []string{"memory", "pids"}

// agentMemoryReserve is how much of a box's memory user code cannot take:
// a quarter of it, at most 32 MiB (the agent uses about 10 MiB).
func agentMemoryReserve(limit int64) int64 { return min(limit/4, 32<<20) }

// agentPidsReserve is how many of a box's pids user code cannot take: half
// of them, at most 32 (the agent runs about a dozen threads).
func agentPidsReserve(limit int64) int64 { return min(limit/2, 32) }

// userMemory and userPids are user code's limits in a box with r's.
func userMemory(limit int64) int64 { return limit - agentMemoryReserve(limit) }
func userPids(limit int64) int64   { return limit - agentPidsReserve(limit) }

// userCgroupControllers lists the controllers, of userControllers, that the
// host mounts as v1: those get a user cgroup, in this order (the agent's
// --user-cgroup-fd flags follow it).
func (l cgroupLayout) userCgroupControllers() []string {
	var out []string
	for _, c := range userControllers {
		if _, ok := l.v1[c]; ok {
			out = append(out, c)
		}
	}
	return out
}

// makeUserCgroups makes box id's cgroup and its user cgroup in every
// controller userCgroupControllers lists, with user code's limits for r,
// and opens each user cgroup's `tasks` file for the agent (in that order).
// The runtime then finds the box's cgroup made and sets its limits; the
// box's cgroups are removed, nested ones first, by cgroupLayout.remove.
func (l cgroupLayout) makeUserCgroups(id string, r runtime.Resources, swapLimit bool) (files []*os.File, err error) {
	defer func() {
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			files = nil
		}
	}()
	for _, ctrl := range l.userCgroupControllers() {
		box, _ := l.controllerDir(ctrl, id)
		dir := filepath.Join(box, userCgroup)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create user cgroup: %w", err)
		}
		if err := l.setUserLimits(ctrl, id, r, swapLimit, nil); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(filepath.Join(dir, "tasks"), os.O_WRONLY, 0)
		if err != nil {
			return nil, fmt.Errorf("open user cgroup: %w", err)
		}
		files = append(files, f)
	}
	return files, nil
}

// setUserLimits writes the user cgroup's limits for r's non-zero fields in
// controller ctrl (a no-op for a controller without a user cgroup), pushing
// their undoing onto undo if it is not nil.
func (l cgroupLayout) setUserLimits(ctrl, id string, r runtime.Resources, swapLimit bool, undo *cleanup.Stack) error {
	box, v2 := l.controllerDir(ctrl, id)
	if v2 {
		return nil
	}
	dir := filepath.Join(box, userCgroup)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil // a box made before user cgroups: it keeps the old layout
	}
	set := func(file string, v int64) error {
		path := filepath.Join(dir, file)
		if undo != nil {
			return ocibox.SetCgroupFile(path, strconv.FormatInt(v, 10), undo)
		}
		return ocibox.WriteCgroupFile(path, strconv.FormatInt(v, 10))
	}
	switch {
	case ctrl == "memory" && r.MemoryBytes > 0:
		v := userMemory(r.MemoryBytes)
		// memory <= memory+swap at every step, as in setMemory.
		files := []string{"memory.limit_in_bytes"}
		if swapLimit {
			files = []string{"memory.memsw.limit_in_bytes", "memory.limit_in_bytes"}
			if ocibox.ReadCgroupInt(filepath.Join(dir, "memory.limit_in_bytes")) > v {
				files = []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"}
			}
		}
		for _, f := range files {
			if err := set(f, v); err != nil {
				return fmt.Errorf("user memory limit: %w", err)
			}
		}
	case ctrl == "pids" && r.Pids > 0:
		if err := set("pids.max", userPids(r.Pids)); err != nil {
			return fmt.Errorf("user pids limit: %w", err)
		}
	}
	return nil
}
