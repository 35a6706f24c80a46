//go:build linux

package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/pidwatch"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/ocibox"
)

// A gvisor box's agent runs inside gVisor's kernel, not as a host process:
// what the host sees are runsc's sandbox process (the sentry) and its gofer.
// The sentry ends when the box's init (the agent) ends, exiting with the
// init's status (128+signal when a signal killed it), and the gofer follows.
// So the sandbox process is what Watch watches, and both are recorded at
// create, by pid and start time, so Destroy can reap them: `runsc run
// --detach` exits at once, leaving them to the nearest subreaper, which is
// the daemon (the oci driver makes it one), and unreaped they would stay
// zombies, two per destroyed box, until the daemon exits.

var _ runtime.Watcher = (*Driver)(nil)

// procRef names a host process across pid reuse.
type procRef struct {
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// sandboxPidFile is where `runsc run --pid-file` writes the sandbox's pid.
func sandboxPidFile(box string) string { return filepath.Join(box, "sandbox.pid") }

// runscProcs finds box id's sandbox process (from the pid file runsc wrote)
// and the runsc processes in its cgroup that are our children: the sandbox
// and the gofer once `runsc run` has exited.
func (d *Driver) runscProcs(id, box string) (sandbox procRef, children []procRef) {
	if b, err := os.ReadFile(sandboxPidFile(box)); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
			sandbox = procRef{Pid: pid, Start: pidwatch.StartTime(pid)}
		}
	}
	for pid, start := range pidwatch.ChildrenOf(cgroupPids(d.cgParent, id)) {
		children = append(children, procRef{Pid: pid, Start: start})
	}
	return sandbox, children
}

// reapChildren reaps those of procs that are still our children once they
// exit (teardown killed them).
func reapChildren(procs []procRef) error {
	var errs []error
	for _, p := range procs {
		if err := pidwatch.ReapIfOurs(p.Pid, p.Start, 10*time.Second); err != nil {
			errs = append(errs, fmt.Errorf("reap runsc process: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Watch reports when box h's agent ends (runtime.Watcher), by watching its
// sandbox process with a pidfd (pidwatch): the sentry exits with the
// agent's status. An OOM kill counted in the box's cgroup while it was
// watched is named.
func (d *Driver) Watch(ctx context.Context, h runtime.Handle) (<-chan runtime.Exit, error) {
	if err := checkID(h.ID); err != nil {
		return nil, err
	}
	sb := parseHandle(h).Sandbox
	if sb.Pid <= 0 || sb.Start == 0 {
		return nil, fmt.Errorf("watch box %s: its handle records no sandbox process: %w", h.ID, errors.ErrUnsupported)
	}
	oomBase := oomKills(d.cgParent, h.ID)
	ch, err := pidwatch.Watch(ctx, sb.Pid, sb.Start, func(st pidwatch.Status) runtime.Exit {
		ex := sandboxExit(st)
		if ex.Signal == int(unix.SIGKILL) && oomKills(d.cgParent, h.ID) > oomBase {
			ex.OOMKilled = true
			ex.Reason = "OOM-killed (" + ex.Reason + ")"
		}
		return ex
	})
	if err != nil {
		return nil, fmt.Errorf("watch box %s: %w", h.ID, err)
	}
	return ch, nil
}

// sandboxExit says how the agent ended, given how its sandbox process did:
// runsc exits with 128+N when signal N killed the box's init, and with 128
// alone when runsc itself failed.
func sandboxExit(st pidwatch.Status) runtime.Exit {
	switch {
	case st.Unknown != "":
		return runtime.Exit{Reason: st.String()}
	case st.Signal != 0:
		return runtime.Exit{Reason: "died with its gVisor sandbox process, " + st.String(), Signal: st.Signal}
	case st.Code > 128 && st.Code <= 128+64:
		sig := st.Code - 128
		return runtime.Exit{Reason: "killed by signal " + pidwatch.SignalName(sig), Signal: sig}
	case st.Code == 128:
		return runtime.Exit{Reason: "died with its gVisor sandbox process (runsc failed, status 128; see runsc.log)"}
	default:
		return runtime.Exit{Reason: st.String()}
	}
}

// cgroupPids lists the processes in box id's cgroup, in every hierarchy
// that has it.
func cgroupPids(parent, id string) []int {
	var pids []int
	seen := map[int]bool{}
	for _, root := range ocibox.CgroupRoots() {
		b, err := os.ReadFile(filepath.Join(root, parent, id, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 0 && !seen[pid] {
				seen[pid] = true
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// oomKills counts the OOM kills in box id's memory cgroup (v1's
// memory.oom_control, or v2's memory.events).
func oomKills(parent, id string) int64 {
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup/memory", parent, id, "memory.oom_control"),
		filepath.Join("/sys/fs/cgroup", parent, id, "memory.events"),
	} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				return n
			}
		}
	}
	return 0
}
