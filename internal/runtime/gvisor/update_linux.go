//go:build linux

package gvisor

import (
	"context"
	"errors"
	"fmt"
	"math"
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

// Update changes the limits of a running or paused box; zero fields of r
// are left as they are. The limits are the box's host cgroup (runsc's
// sandbox, gofer and their threads: resources) and its writable layer's
// tmpfs, written directly as the oci driver does rather than through `runsc
// update`, which would only do the same through the sandbox's control
// socket. The checks, the order and the rollback are ocibox.Limits.Apply's,
// shared with the oci driver; pids limits get runsc's allowance on top.
//
// gVisor's kernel sized itself from the limits at start: /proc/meminfo and
// the CPU count inside keep showing those, while the host enforces the new
// ones.
func (d *Driver) Update(ctx context.Context, h runtime.Handle, r runtime.Resources) error {
	if err := checkID(h.ID); err != nil {
		return err
	}
	if err := ocibox.CheckResources(h.ID, r); err != nil {
		return err
	}
	mem, memV2, ok := d.cgroupFile(h.ID, "memory.limit_in_bytes", "memory.max")
	if !ok {
		return fmt.Errorf("update box %s: no cgroup: %w", h.ID, errdefs.ErrNotFound)
	}
	pidsMax, _, _ := d.cgroupFile(h.ID, "pids.max")
	return ocibox.Limits{
		ID: h.ID, WritableLayer: rwDir(d.boxDir(h.ID)), MemoryDir: filepath.Dir(mem), MemoryV2: memV2,
		CheckPids: func(limit int64) error {
			cur := ocibox.ReadCgroupInt(filepath.Join(filepath.Dir(pidsMax), "pids.current"))
			if cur > limit+pidsOverhead {
				return fmt.Errorf("pids limit: cannot lower to %d, the box runs %d host threads (%d of them runsc's allowance): %w",
					limit, cur, pidsOverhead, errdefs.ErrFailedPrecondition)
			}
			return nil
		},
		SetMemory: func(limit int64, undo *cleanup.Stack) error { return setMemory(mem, memV2, limit, undo) },
		SetPids: func(limit int64, undo *cleanup.Stack) error {
			if pidsMax == "" {
				return fmt.Errorf("pids limit: box %s has no pids cgroup: %w", h.ID, errdefs.ErrNotFound)
			}
			if err := ocibox.SetCgroupFile(pidsMax, strconv.FormatInt(limit+pidsOverhead, 10), undo); err != nil {
				return fmt.Errorf("pids limit: %w", err)
			}
			return nil
		},
		SetCPU: func(millis int64, undo *cleanup.Stack) error { return d.setCPU(h.ID, millis, undo) },
	}.Apply(r)
}

// setMemory sets the memory limit file and, on v1 where memory+swap was
// limited with it, memory+swap too, in the order v1 requires (memory <=
// memory+swap at every step).
func setMemory(mem string, v2 bool, limit int64, undo *cleanup.Stack) error {
	val := strconv.FormatInt(limit, 10)
	files := []string{mem}
	if !v2 {
		memsw := filepath.Join(filepath.Dir(mem), "memory.memsw.limit_in_bytes")
		if cur := ocibox.ReadCgroupInt(memsw); cur > 0 && cur < math.MaxInt64/2 {
			if ocibox.ReadCgroupInt(mem) <= limit {
				files = []string{memsw, mem}
			} else {
				files = []string{mem, memsw}
			}
		}
	}
	for _, f := range files {
		if err := ocibox.SetCgroupFile(f, val, undo); err != nil {
			if errors.Is(err, unix.EBUSY) {
				used := ocibox.ReadCgroupInt(filepath.Join(filepath.Dir(mem), "memory.usage_in_bytes"))
				return fmt.Errorf("memory limit: cannot lower to %d bytes, the box uses %d bytes the kernel could not reclaim: %w", limit, used, errdefs.ErrFailedPrecondition)
			}
			return fmt.Errorf("memory limit: %w", err)
		}
	}
	return nil
}

// setCPU sets the CFS quota for millis thousandths of a CPU (the period
// Create set: resources).
func (d *Driver) setCPU(id string, millis int64, undo *cleanup.Stack) error {
	const period = 100000
	quota := millis * 100
	if f, v2, ok := d.cgroupFile(id, "cpu.cfs_quota_us", "cpu.max"); ok {
		if v2 {
			return ocibox.SetCgroupFile(f, fmt.Sprintf("%d %d", quota, period), undo)
		}
		if err := ocibox.SetCgroupFile(filepath.Join(filepath.Dir(f), "cpu.cfs_period_us"), strconv.Itoa(period), undo); err != nil {
			return err
		}
		return ocibox.SetCgroupFile(f, strconv.FormatInt(quota, 10), undo)
	}
	return fmt.Errorf("box %s has no cpu cgroup: %w", id, errdefs.ErrNotFound)
}

// cgroupFile finds box id's cgroup file: the v1 name in whichever v1
// hierarchy has it, else the v2 name (a v2 file tells by its name:
// v1Name is checked first in every hierarchy). ok is false if neither
// exists.
func (d *Driver) cgroupFile(id, v1Name string, v2Name ...string) (path string, v2, ok bool) {
	roots := ocibox.CgroupRoots()
	for _, name := range append([]string{v1Name}, v2Name...) {
		for _, root := range roots {
			p := filepath.Join(root, d.cgParent, id, name)
			if _, err := os.Stat(p); err == nil {
				return p, name != v1Name, true
			}
		}
	}
	return "", false, false
}
