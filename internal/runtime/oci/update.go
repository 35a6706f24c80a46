//go:build linux

package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/cleanup"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
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
	var disk *tmpfsState
	if r.DiskBytes > 0 {
		if disk, err = d.checkDisk(id, r.DiskBytes); err != nil {
			return err
		}
	}
	if r.Pids > 0 {
		dir, _ := d.cg.controllerDir("pids", id)
		if cur := readInt(filepath.Join(dir, "pids.current")); cur > r.Pids {
			return fmt.Errorf("pids limit: cannot lower to %d, the box runs %d processes", r.Pids, cur)
		}
	}
	if r.MemoryBytes > 0 {
		if dir, v2 := d.cg.controllerDir("memory", id); v2 {
			// cgroup v2 does not refuse a memory.max below usage, it OOM-kills
			// the box's processes: refuse here what reclaim cannot free.
			used := readInt(filepath.Join(dir, "memory.current")) - readKey(filepath.Join(dir, "memory.stat"), "inactive_file")
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
		if err := disk.resize(r.DiskBytes); err != nil {
			return fmt.Errorf("disk limit: %w", err)
		}
		undo.Add(func() error { return disk.resize(disk.size) })
	}
	if r.Pids > 0 {
		dir, _ := d.cg.controllerDir("pids", id)
		if err := setCgroupFile(filepath.Join(dir, "pids.max"), strconv.FormatInt(r.Pids, 10), &undo); err != nil {
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
			err = setCgroupFile(filepath.Join(dir, "cpu.max"), fmt.Sprintf("%d %d", quota, cpuPeriod), &undo)
			if err == nil { // runc's conversion of the shares Create gave
				weight := 1 + (cpuShares(r.CPUMillis)-2)*9999/262142
				err = setCgroupFile(filepath.Join(dir, "cpu.weight"), strconv.FormatUint(weight, 10), &undo)
			}
		} else {
			// The period first: the quota is relative to it. Create sets the
			// same period, so this normally changes nothing.
			err = setCgroupFile(filepath.Join(dir, "cpu.cfs_period_us"), strconv.Itoa(cpuPeriod), &undo)
			if err == nil {
				err = setCgroupFile(filepath.Join(dir, "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10), &undo)
			}
			if err == nil {
				err = setCgroupFile(filepath.Join(dir, "cpu.shares"), strconv.FormatUint(cpuShares(r.CPUMillis), 10), &undo)
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
			if err := setCgroupFile(filepath.Join(dir, "memory.swap.max"), "0", undo); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("memory limit: swap: %w", err)
			}
		}
		if err := setCgroupFile(filepath.Join(dir, "memory.max"), val, undo); err != nil {
			return fmt.Errorf("memory limit: %w", err)
		}
		return nil
	}
	// v1 requires memory <= memory+swap at every step: raise memsw before
	// memory when growing, lower memory before memsw when shrinking.
	mem, memsw := filepath.Join(dir, "memory.limit_in_bytes"), filepath.Join(dir, "memory.memsw.limit_in_bytes")
	files := []string{mem}
	if d.swapLimit {
		if readInt(mem) <= limit {
			files = []string{memsw, mem}
		} else {
			files = []string{mem, memsw}
		}
	}
	for _, f := range files {
		if err := setCgroupFile(f, val, undo); err != nil {
			if errors.Is(err, unix.EBUSY) {
				used := readInt(filepath.Join(dir, "memory.usage_in_bytes"))
				return fmt.Errorf("memory limit: cannot lower to %d bytes, the box uses %d bytes the kernel could not reclaim: %w", limit, used, err)
			}
			return fmt.Errorf("memory limit: %w", err)
		}
	}
	return nil
}

// setCgroupFile writes val into a cgroup file and, on success, pushes the
// restoration of the file's previous content onto undo.
func setCgroupFile(path, val string, undo *cleanup.Stack) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := writeCgroupFile(path, val); err != nil {
		return err
	}
	prev := strings.TrimSpace(string(old))
	undo.Add(func() error { return writeCgroupFile(path, prev) })
	return nil
}

func writeCgroupFile(path, val string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(val)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %q: %w", val, err) // err names the file
	}
	return nil
}

// tmpfsState is a box's writable-layer tmpfs as found before resizing it.
type tmpfsState struct {
	dir   string
	flags uintptr // per-mount flags (MS_*) to keep across the remount
	size  int64
}

// checkDisk checks that the box's writable layer can be resized to size.
func (d *Driver) checkDisk(id string, size int64) (*tmpfsState, error) {
	dir := rwDir(d.boxDir(id))
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return nil, fmt.Errorf("disk limit: writable layer: %w", err)
	}
	if st.Type != unix.TMPFS_MAGIC {
		return nil, fmt.Errorf("disk limit: writable layer %s is not mounted: %w", dir, errdefs.ErrNotFound)
	}
	if st.Blocks == 0 {
		// The kernel cannot retroactively limit an unlimited tmpfs.
		return nil, fmt.Errorf("disk limit: the box was created without one and cannot get one now: %w", errdefs.ErrFailedPrecondition)
	}
	used := int64(st.Blocks-st.Bfree) * st.Bsize
	if size < used {
		return nil, fmt.Errorf("disk limit: cannot lower to %d bytes, the box uses %d bytes: %w", size, used, errdefs.ErrFailedPrecondition)
	}
	return &tmpfsState{dir: dir, flags: mountFlags(st.Flags), size: int64(st.Blocks) * st.Bsize}, nil
}

// resize remounts the tmpfs with a new size, keeping its mount flags (a
// remount resets those it is not given) and its other options (tmpfs only
// changes the options a remount names).
func (t *tmpfsState) resize(size int64) error {
	err := unix.Mount("tmpfs", t.dir, "tmpfs", unix.MS_REMOUNT|t.flags, "size="+strconv.FormatInt(size, 10))
	if err != nil {
		return fmt.Errorf("resize writable layer to %d bytes: %w", size, err)
	}
	return nil
}

// mountFlags translates statfs f_flags (ST_*) into the MS_* flags that
// remounting must repeat to keep them.
func mountFlags(stFlags int64) uintptr {
	var ms uintptr
	for _, f := range []struct {
		st int64
		ms uintptr
	}{
		{unix.ST_RDONLY, unix.MS_RDONLY}, {unix.ST_NOSUID, unix.MS_NOSUID}, {unix.ST_NODEV, unix.MS_NODEV},
		{unix.ST_NOEXEC, unix.MS_NOEXEC}, {unix.ST_SYNCHRONOUS, unix.MS_SYNCHRONOUS}, {unix.ST_MANDLOCK, unix.MS_MANDLOCK},
		{unix.ST_NOATIME, unix.MS_NOATIME}, {unix.ST_NODIRATIME, unix.MS_NODIRATIME}, {unix.ST_RELATIME, unix.MS_RELATIME},
	} {
		if stFlags&f.st != 0 {
			ms |= f.ms
		}
	}
	return ms
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
