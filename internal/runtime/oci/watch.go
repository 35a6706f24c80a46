//go:build linux

package oci

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/pidwatch"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/ocibox"
)

var (
	_ runtime.Watcher = (*Driver)(nil)
	_ runtime.Killer  = (*Driver)(nil)
)

// Kill sends SIGKILL to the box's init (runtime.Killer), identified by the
// pid and start time recorded at create, through a pidfd: the agent is
// PID 1 of the box's pid namespace, so the kernel kills every process in
// it. Destroy, later, releases the box's mounts, cgroups and runtime state.
// A box whose init is gone already is no error.
func (d *Driver) Kill(_ context.Context, h runtime.Handle) error {
	if err := checkID(h.ID); err != nil {
		return err
	}
	data, err := parseData(h)
	if err != nil {
		return fmt.Errorf("kill box %s: %w", h.ID, err)
	}
	if err := pidwatch.Kill(data.Pid, data.StartTime); err != nil {
		return fmt.Errorf("kill box %s: %w", h.ID, err)
	}
	return nil
}

// Watch reports when the box's init (the agent, PID 1 of the box) exits
// (runtime.Watcher), through a pidfd on the init recorded at create (pid
// and start time, so a reused pid is never mistaken for it; see pidwatch).
// If the init is already gone, the Exit is in the channel before Watch
// returns. The exit status is read with WNOWAIT while the init is our child
// (we are the subreaper that adopted it at create), leaving the zombie, and
// with it the pid, to Destroy's reap; a box recovered after a restart is
// not our child, and its status is read from its zombie if whoever adopted
// it has not reaped it yet.
func (d *Driver) Watch(ctx context.Context, h runtime.Handle) (<-chan runtime.Exit, error) {
	if err := checkID(h.ID); err != nil {
		return nil, err
	}
	data, err := parseData(h)
	if err != nil {
		return nil, fmt.Errorf("watch box %s: %w", h.ID, err)
	}
	if data.Pid <= 0 || data.StartTime == 0 {
		return nil, fmt.Errorf("watch box %s: its handle records no init: %w", h.ID, errors.ErrUnsupported)
	}
	oomBase := d.cg.ownOOMKills(h.ID)
	ch, err := pidwatch.Watch(ctx, data.Pid, data.StartTime, func(st pidwatch.Status) runtime.Exit {
		ex := runtime.Exit{Reason: st.String(), Signal: st.Signal}
		if st.Signal == int(unix.SIGKILL) && d.cg.ownOOMKills(h.ID) > oomBase {
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

// ownOOMKills counts the OOM kills in the box cgroup itself, where the
// agent is, leaving out the user cgroup's (user code's).
func (l cgroupLayout) ownOOMKills(id string) int64 {
	mem, v2 := l.controllerDir("memory", id)
	if v2 {
		return ocibox.ReadCgroupKey(filepath.Join(mem, "memory.events.local"), "oom_kill")
	}
	return ocibox.ReadCgroupKey(filepath.Join(mem, "memory.oom_control"), "oom_kill")
}
