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
// socket. What can be checked first is (disk and pids in use, memory on
// cgroup v2), so a limit below use fails before anything changes; one the
// kernel refuses while applying rolls back the limits already changed.
//
// gVisor's kernel sized itself from the limits at start: /proc/meminfo and
// the CPU count inside keep showing those, while the host enforces the new
// ones.
func (d *Driver) Update(ctx context.Context, h runtime.Handle, r runtime.Resources) (err error) {
	if err := checkID(h.ID); err != nil {
		return err
	}
	if r.MemoryBytes < 0 || r.CPUMillis < 0 || r.Pids < 0 || r.DiskBytes < 0 {
		return fmt.Errorf("update box %s: negative limit in %+v: %w", h.ID, r, errdefs.ErrInvalidArgument)
	}
	if _, _, ok := d.cgroupFile(h.ID, "memory.limit_in_bytes", "memory.max"); !ok {
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
	pidsMax, _, _ := d.cgroupFile(id, "pids.max")
	if r.Pids > 0 {
		cur := ocibox.ReadCgroupInt(filepath.Join(filepath.Dir(pidsMax), "pids.current"))
		if cur > r.Pids+pidsOverhead {
			return fmt.Errorf("pids limit: cannot lower to %d, the box runs %d host threads (%d of them runsc's allowance): %w",
				r.Pids, cur, pidsOverhead, errdefs.ErrFailedPrecondition)
		}
	}
	mem, memV2, _ := d.cgroupFile(id, "memory.limit_in_bytes", "memory.max")
	if r.MemoryBytes > 0 && memV2 {
		// cgroup v2 does not refuse a memory.max below usage, it OOM-kills
		// gVisor's kernel: refuse here what reclaim cannot free.
		dir := filepath.Dir(mem)
		used := ocibox.ReadCgroupInt(filepath.Join(dir, "memory.current")) - ocibox.ReadCgroupKey(filepath.Join(dir, "memory.stat"), "inactive_file")
		if used > r.MemoryBytes {
			return fmt.Errorf("memory limit: cannot lower to %d bytes, the box uses %d bytes that cannot be reclaimed: %w", r.MemoryBytes, used, errdefs.ErrFailedPrecondition)
		}
	}

	// Then apply, most likely to be refused first.
	if r.MemoryBytes > 0 {
		if err := setMemory(mem, memV2, r.MemoryBytes, &undo); err != nil {
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
		if pidsMax == "" {
			return fmt.Errorf("pids limit: box %s has no pids cgroup: %w", id, errdefs.ErrNotFound)
		}
		if err := ocibox.SetCgroupFile(pidsMax, strconv.FormatInt(r.Pids+pidsOverhead, 10), &undo); err != nil {
			return fmt.Errorf("pids limit: %w", err)
		}
	}
	if r.CPUMillis > 0 {
		if err := d.setCPU(id, r.CPUMillis, &undo); err != nil {
			return fmt.Errorf("cpu limit: %w", err)
		}
	}
	return nil
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
