//go:build linux

package oci

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/agentconn"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/hostmount"
	"github.com/sbxdev/sbx/internal/idmap"
	"github.com/sbxdev/sbx/internal/runtime"
)

// reapTimeout bounds how long Destroy waits for a killed box init to exit.
const reapTimeout = 5 * time.Second

// Destroy kills the box and removes every host resource it had. It is
// idempotent and takes no global lock.
//
// Fast path (no runtime process, a few ms): SIGKILL the init pid recorded at
// create (checked against its start time to rule out pid reuse) — the kernel
// then kills every process of the box's pid namespace —, thaw the freezer so
// a paused box can die, reap the init, remove the box cgroups and the
// runtime's state dir ourselves (what `runc delete` would do for a stopped
// container with no hooks). If the init is unknown or gone, fall back to
// `<runtime> delete --force`.
func (d *Driver) Destroy(ctx context.Context, h runtime.Handle) error {
	if err := checkID(h.ID); err != nil {
		return err
	}
	data, _ := parseData(h) // unreadable or newer: torn down by the id alone
	return d.destroy(ctx, h.ID, &data)
}

func (d *Driver) destroy(ctx context.Context, id string, data *boxData) error {
	terr := d.teardownProcesses(ctx, id, data)
	errs := []error{terr}
	box := d.boxDir(id)
	mounts, err := hostmount.Under(box)
	errs = append(errs, err)
	mounted := err != nil
	for _, m := range mounts {
		if err := hostmount.Unmount(m); err != nil {
			errs = append(errs, err)
			mounted = true
		}
	}
	// The box dir is the driver's, but its tmpfs (the box's upper dir) and
	// the overlay are the box's: never remove through a mount that is still
	// there (Cleanup retries). os.RemoveAll opens only its argument's
	// parent by path and goes on fd-relative with O_NOFOLLOW (Go 1.26,
	// os/removeall_at.go), so nothing below box is ever followed either.
	if !mounted {
		if err := os.RemoveAll(box); err != nil {
			errs = append(errs, fmt.Errorf("remove box dir: %w", err))
		} else if terr == nil {
			// No process runs with the box's ids and nothing on disk has
			// them (everything it wrote went through idmapped mounts into
			// the canonical range, or into its own namespaces' tmpfs): its
			// range can go to another box.
			errs = append(errs, d.releaseIDs(box, data.IDs))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("destroy box %s: %w", id, err)
	}
	return nil
}

// teardownProcesses kills the box, reaps its init and removes its runtime
// state and cgroups.
func (d *Driver) teardownProcesses(ctx context.Context, id string, data *boxData) error {
	var errs []error
	if data.Pid == 0 {
		// Unknown init (a crash mid-create, Cleanup): ask the runtime.
		if st, err := d.rt.state(ctx, id); err == nil && st.Pid > 0 {
			data.Pid, data.StartTime = st.Pid, procStartTime(st.Pid)
		}
	}
	killed := false
	if data.Pid > 0 && data.StartTime != 0 && procStartTime(data.Pid) == data.StartTime {
		if err := unix.Kill(data.Pid, unix.SIGKILL); err == nil {
			d.cg.thaw(id)
			if err := reap(data.Pid, reapTimeout); err != nil {
				errs = append(errs, err)
			} else {
				killed = true
			}
		}
	}
	stateDir := d.rt.stateDir(id)
	if _, err := os.Stat(stateDir); err == nil {
		if !killed {
			if err := d.rt.run(ctx, "delete", "--force", id); err != nil && !strings.Contains(err.Error(), "does not exist") {
				errs = append(errs, err)
			}
			if data.Pid > 0 {
				_ = reap(data.Pid, reapTimeout) // our zombie if we started it
			}
		}
		if err := os.RemoveAll(stateDir); err != nil {
			errs = append(errs, fmt.Errorf("remove runtime state: %w", err))
		}
	}
	if err := d.cg.remove(id); err != nil {
		errs = append(errs, err)
	}
	d.rt.reapOrphans()
	return errors.Join(errs...)
}

// Recover re-attaches to a box that is running (its agent answers Hello) or
// paused; anything else is destroyed and reported as errdefs.ErrNotFound.
func (d *Driver) Recover(ctx context.Context, h runtime.Handle) (runtime.Handle, error) {
	if err := checkID(h.ID); err != nil {
		return h, err
	}
	data, err := parseData(h)
	if errors.Is(err, runtime.ErrHandleVersion) {
		return h, err // a newer daemon's box: left alone
	}
	// Fast path, no runtime process (a restart re-attaches every box, and
	// `runc state` costs a fork/exec of the runtime each): the init recorded
	// at create is still there (start time checked, so not a reused pid)
	// and its agent answers, or its freezer says it is paused.
	if data.Pid > 0 && data.StartTime != 0 && procStartTime(data.Pid) == data.StartTime {
		if d.cg.frozen(h.ID) {
			if _, serr := os.Stat(sockPath(d.boxDir(h.ID))); serr == nil {
				return h, nil
			}
		} else if d.hello(ctx, h.ID) == nil {
			return h, nil
		}
	}
	st, err := d.rt.state(ctx, h.ID)
	if err == nil {
		switch st.Status {
		case "paused":
			if _, serr := os.Stat(sockPath(d.boxDir(h.ID))); serr == nil {
				return h, nil // a frozen agent cannot answer; Resume will tell
			}
		case "running":
			if err = d.hello(ctx, h.ID); err == nil {
				return h, nil
			}
		default:
			err = fmt.Errorf("runtime says %s", st.Status)
		}
	}
	if derr := d.destroy(ctx, h.ID, &data); derr != nil {
		d.log.Warn("destroying unrecoverable box", "id", h.ID, "err", derr)
	}
	return h, fmt.Errorf("recover box %s (%v): %w", h.ID, err, errdefs.ErrNotFound)
}

func (d *Driver) hello(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn := agentconn.New(func(ctx context.Context) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "unix", sockPath(d.boxDir(id)))
	})
	defer conn.Close()
	_, err := conn.Hello(ctx)
	return err
}

// Cleanup destroys every box whose id is not in keep: box dirs, mounts under
// StateDir, runtime containers under our --root and cgroups under the sbx
// parent. Runtime state under other runtimes' roots (after switching runtime)
// is not looked at.
func (d *Driver) Cleanup(ctx context.Context, keep map[string]bool) error {
	ids := d.cg.ids()
	if ents, err := os.ReadDir(d.boxesDir); err == nil {
		for _, e := range ents {
			ids[e.Name()] = true
		}
	}
	if listed, err := d.rt.list(ctx); err == nil {
		for _, id := range listed {
			ids[id] = true
		}
	} else {
		d.log.Warn("listing runtime containers", "err", err)
	}
	var errs []error
	if mounts, err := hostmount.Under(d.boxesDir); err == nil {
		for _, m := range mounts {
			rel, _ := filepath.Rel(d.boxesDir, m)
			id, _, _ := strings.Cut(rel, "/")
			ids[id] = true
		}
	}
	for id := range ids {
		if keep[id] || checkID(id) != nil {
			continue
		}
		d.log.Info("cleaning up leftover box", "id", id)
		if err := d.destroy(ctx, id, &boxData{}); err != nil {
			errs = append(errs, err)
		}
	}
	// Ranges of boxes whose dir is gone (a crash between removing the dir
	// and freeing the range).
	if held, err := d.ids.Held(d.boxesDir); err == nil {
		for owner, r := range held {
			if rel, err := filepath.Rel(d.boxesDir, owner); err == nil && !keep[rel] && !exists(owner) {
				errs = append(errs, d.ids.Release(r, owner))
			}
		}
	} else {
		errs = append(errs, err)
	}
	// Ranges of any owner on the host that is gone and that no process
	// uses (a daemon's data dir deleted with its boxes stopped: no daemon
	// would ever look at them again).
	if freed, err := d.ids.Sweep("", idmap.SweepMinAge); err != nil {
		errs = append(errs, err)
	} else if len(freed) > 0 {
		d.log.Info("freed id ranges whose owner is gone", "count", len(freed))
	}
	// Temp dirs of an interrupted host image build.
	if ents, err := os.ReadDir(d.imagesDir); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".tmp-") {
				errs = append(errs, os.RemoveAll(filepath.Join(d.imagesDir, e.Name())))
			}
		}
	}
	return errors.Join(errs...)
}
