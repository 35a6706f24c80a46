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
// left as they are. The checks (a limit below use fails before anything
// changes), the order and the rollback of what was changed when the kernel
// refuses a limit are ocibox.Limits.Apply's, shared with the gvisor driver.
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
	if err := ocibox.CheckResources(h.ID, r); err != nil {
		return err
	}
	id := h.ID
	memDir, memV2 := d.cg.controllerDir("memory", id)
	if !exists(memDir) {
		return fmt.Errorf("update box %s: no cgroup: %w", id, errdefs.ErrNotFound)
	}
	pidsDir, _ := d.cg.controllerDir("pids", id)
	return ocibox.Limits{
		ID: id, WritableLayer: rwDir(d.boxDir(id)), MemoryDir: memDir, MemoryV2: memV2,
		CheckPids: func(limit int64) error {
			if cur := ocibox.ReadCgroupInt(filepath.Join(pidsDir, "pids.current")); cur > limit {
				return fmt.Errorf("pids limit: cannot lower to %d, the box runs %d processes: %w", limit, cur, errdefs.ErrFailedPrecondition)
			}
			return nil
		},
		SetMemory: func(limit int64, undo *cleanup.Stack) error {
			if err := d.setMemory(id, limit, undo); err != nil {
				return err
			}
			return d.cg.setUserLimits("memory", id, r, d.swapLimit, undo)
		},
		SetPids: func(limit int64, undo *cleanup.Stack) error {
			if err := ocibox.SetCgroupFile(filepath.Join(pidsDir, "pids.max"), strconv.FormatInt(limit, 10), undo); err != nil {
				return fmt.Errorf("pids limit: %w", err)
			}
			return d.cg.setUserLimits("pids", id, r, d.swapLimit, undo)
		},
		SetCPU: func(millis int64, undo *cleanup.Stack) error { return d.setCPU(id, millis, undo) },
	}.Apply(r)
}

// setCPU sets the CFS quota and the shares (v1) or weight (v2) for millis
// thousandths of a CPU, with the period Create set.
func (d *Driver) setCPU(id string, millis int64, undo *cleanup.Stack) error {
	quota := cpuQuota(millis)
	dir, v2 := d.cg.controllerDir("cpu", id)
	if v2 {
		if err := ocibox.SetCgroupFile(filepath.Join(dir, "cpu.max"), fmt.Sprintf("%d %d", quota, cpuPeriod), undo); err != nil {
			return err
		}
		// runc's conversion of the shares Create gave.
		weight := 1 + (cpuShares(millis)-2)*9999/262142
		return ocibox.SetCgroupFile(filepath.Join(dir, "cpu.weight"), strconv.FormatUint(weight, 10), undo)
	}
	// The period first: the quota is relative to it. Create sets the same
	// period, so this normally changes nothing.
	if err := ocibox.SetCgroupFile(filepath.Join(dir, "cpu.cfs_period_us"), strconv.Itoa(cpuPeriod), undo); err != nil {
		return err
	}
	if err := ocibox.SetCgroupFile(filepath.Join(dir, "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10), undo); err != nil {
		return err
	}
	return ocibox.SetCgroupFile(filepath.Join(dir, "cpu.shares"), strconv.FormatUint(cpuShares(millis), 10), undo)
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
