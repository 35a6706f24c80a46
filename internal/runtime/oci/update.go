//go:build linux

package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/cleanup"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/ocibox"
)

var _ runtime.Updater = (*Driver)(nil)

// Update changes the limits of a running or paused box; zero fields of r are
// left as they are. Everything that can be checked up front is (disk and pids
// usage, memory usage on cgroup v2) so that a limit below current usage fails
// before anything changes; a limit the kernel refuses while applying (a
// memory limit on cgroup v1 it cannot reclaim down to, say) rolls back the
// limits already changed. The error names the limit that could not be set.
//
// Limits are written straight into the box's cgroup files (v1 or v2 per
// controller, as the host mounts them) rather than through `<runtime>
// update`: same effect, no runtime process. The runtime's own record of the
// limits (its state.json) is then stale, which only matters to `<runtime>
// update`, which the driver never runs.
func (d *Driver) Update(ctx context.Context, h runtime.Handle, r runtime.Resources) error {
	if err := checkID(h.ID); err != nil {
		return err
	}
	if r.MemoryBytes < 0 || r.CPUMillis < 0 || r.Pids < 0 || r.DiskBytes < 0 {
		return fmt.Errorf("update box %s: negative limit in %+v: %w", h.ID, r, errdefs.ErrInvalidArgument)
	}
	if mem, _ := d.cg.controllerDir("memory", h.ID); !exists(mem) {
		return fmt.Errorf("update box %s: no cgroup: %w", h.ID, errdefs.ErrNotFound)
	}
	if err := d.update(h.ID, r); err != nil {
		return fmt.Errorf("update box %s: %w", h.ID, err)
	}
	return nil
}

func (d *Driver) update(id string, r runtime.Resources) (err error) {
	var undo cleanup.Stack
	defer func() {
		if err != nil {
			if uerr := undo.Run(); uerr != nil {
				err = errors.Join(err, fmt.Errorf("rolling back: %w", uerr))
			}
		}
	}()

	// Checks first: nothing has changed yet if one fails.
	var disk *ocibox.Tmpfs
	if r.DiskBytes > 0 {
		if disk, err = ocibox.CheckDisk(rwDir(d.boxDir(id)), r.DiskBytes); err != nil {
			return err
		}
	}
	if r.Pids > 0 {
		dir, _ := d.cg.controllerDir("pids", id)
		if cur := ocibox.ReadCgroupInt(filepath.Join(dir, "pids.current")); cur > r.Pids {
			return fmt.Errorf("pids limit: cannot lower to %d, the box runs %d processes", r.Pids, cur)
		}
	}
	if r.MemoryBytes > 0 {
		if dir, v2 := d.cg.controllerDir("memory", id); v2 {
			// cgroup v2 does not refuse a memory.max below usage, it OOM-kills
			// the box's processes: refuse here what reclaim cannot free.
			used := ocibox.ReadCgroupInt(filepath.Join(dir, "memory.current")) - ocibox.ReadCgroupKey(filepath.Join(dir, "memory.stat"), "inactive_file")
			if used > r.MemoryBytes {
				return fmt.Errorf("memory limit: cannot lower to %d bytes, the box uses %d bytes that cannot be reclaimed", r.MemoryBytes, used)
			}
		}
	}

	// Then apply, most likely to be refused first.
	if r.MemoryBytes > 0 {
		if err := d.setMemory(id, r.MemoryBytes, &undo); err != nil {
			return err
		}
		if err := d.cg.setUserLimits("memory", id, r, d.swapLimit, &undo); err != nil {
			return err
		}
	}
	if disk != nil {
		if err := disk.Resize(r.DiskBytes); err != nil {
			return fmt.Errorf("disk limit: %w", err)
		}
		undo.Add(func() error { return disk.Resize(disk.Size) })
	}
	if r.Pids > 0 {
		dir, _ := d.cg.controllerDir("pids", id)
		if err := ocibox.SetCgroupFile(filepath.Join(dir, "pids.max"), strconv.FormatInt(r.Pids, 10), &undo); err != nil {
			return fmt.Errorf("pids limit: %w", err)
		}
		if err := d.cg.setUserLimits("pids", id, r, d.swapLimit, &undo); err != nil {
			return err
		}
	}
	if r.CPUMillis > 0 {
		quota := cpuQuota(r.CPUMillis)
		dir, v2 := d.cg.controllerDir("cpu", id)
		if v2 {
			err = ocibox.SetCgroupFile(filepath.Join(dir, "cpu.max"), fmt.Sprintf("%d %d", quota, cpuPeriod), &undo)
			if err == nil { // runc's conversion of the shares Create gave
				weight := 1 + (cpuShares(r.CPUMillis)-2)*9999/262142
				err = ocibox.SetCgroupFile(filepath.Join(dir, "cpu.weight"), strconv.FormatUint(weight, 10), &undo)
			}
		} else {
			// The period first: the quota is relative to it. Create sets the
			// same period, so this normally changes nothing.
			err = ocibox.SetCgroupFile(filepath.Join(dir, "cpu.cfs_period_us"), strconv.Itoa(cpuPeriod), &undo)
			if err == nil {
				err = ocibox.SetCgroupFile(filepath.Join(dir, "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10), &undo)
			}
			if err == nil {
				err = ocibox.SetCgroupFile(filepath.Join(dir, "cpu.shares"), strconv.FormatUint(cpuShares(r.CPUMillis), 10), &undo)
			}
		}
		if err != nil {
			return fmt.Errorf("cpu limit: %w", err)
		}
	}
	return nil
}

// setMemory sets the memory limit and, where the host accounts swap,
// memory+swap to the same value (no escaping the limit through swap).
func (d *Driver) setMemory(id string, limit int64, undo *cleanup.Stack) error {
	dir, v2 := d.cg.controllerDir("memory", id)
	val := strconv.FormatInt(limit, 10)
	if v2 {
		if d.swapLimit {
			if err := ocibox.SetCgroupFile(filepath.Join(dir, "memory.swap.max"), "0", undo); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("memory limit: swap: %w", err)
			}
		}
		if err := ocibox.SetCgroupFile(filepath.Join(dir, "memory.max"), val, undo); err != nil {
			return fmt.Errorf("memory limit: %w", err)
		}
		return nil
	}
	// v1 requires memory <= memory+swap at every step: raise memsw before
	// memory when growing, lower memory before memsw when shrinking.
	mem, memsw := filepath.Join(dir, "memory.limit_in_bytes"), filepath.Join(dir, "memory.memsw.limit_in_bytes")
	files := []string{mem}
	if d.swapLimit {
		if ocibox.ReadCgroupInt(mem) <= limit {
			files = []string{memsw, mem}
		} else {
			files = []string{mem, memsw}
		}
	}
	for _, f := range files {
		if err := ocibox.SetCgroupFile(f, val, undo); err != nil {
			if errors.Is(err, unix.EBUSY) {
				used := ocibox.ReadCgroupInt(filepath.Join(dir, "memory.usage_in_bytes"))
				return fmt.Errorf("memory limit: cannot lower to %d bytes, the box uses %d bytes the kernel could not reclaim: %w", limit, used, err)
			}
			return fmt.Errorf("memory limit: %w", err)
		}
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// Close releases what the driver holds on the host beyond its boxes: the
// parent cgroup, when no box is left in it. Boxes keep running.
func (d *Driver) Close() error {
	d.cg.removeParent()
	return nil
}
