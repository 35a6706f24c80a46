//go:build linux

package ocibox

import (
	"bufio"
	"bytes"
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

// What both drivers' Update (runtime.Updater) writes: a box's cgroup files
// and its writable layer's size.

// SetCgroupFile writes val into a cgroup file and, on success, pushes the
// restoration of the file's previous content onto undo.
func SetCgroupFile(path, val string, undo *cleanup.Stack) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := WriteCgroupFile(path, val); err != nil {
		return err
	}
	prev := strings.TrimSpace(string(old))
	undo.Add(func() error { return WriteCgroupFile(path, prev) })
	return nil
}

// WriteCgroupFile writes val into a cgroup file.
func WriteCgroupFile(path, val string) error {
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

// Tmpfs is a box's writable-layer tmpfs as found before resizing it.
type Tmpfs struct {
	dir   string
	flags uintptr // per-mount flags (MS_*) to keep across the remount
	// Size is its size before the resize.
	Size int64
}

// CheckDisk checks that the writable-layer tmpfs at dir (WritableLayer's
// rw) can be resized to size: a limit below what the box uses fails, naming
// both, before anything changes.
func CheckDisk(dir string, size int64) (*Tmpfs, error) {
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
	return &Tmpfs{dir: dir, flags: mountFlags(st.Flags), Size: int64(st.Blocks) * st.Bsize}, nil
}

// Resize remounts the tmpfs with a new size, keeping its mount flags (a
// remount resets those it is not given) and its other options (tmpfs only
// changes the options a remount names).
func (t *Tmpfs) Resize(size int64) error {
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

// ReadCgroupInt reads a cgroup file holding one integer (0 if unreadable).
func ReadCgroupInt(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	return n
}

// ReadCgroupKey reads key's value from a cgroup file of "key value" lines
// (memory.stat, memory.events; 0 if absent).
func ReadCgroupKey(path, key string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// Limits is how one driver reads and writes a box's limits; Apply runs
// the update both drivers share.
type Limits struct {
	// ID names the box in errors.
	ID string
	// WritableLayer is the directory of the box's writable-layer tmpfs
	// (its rw dir): the disk limit is its size.
	WritableLayer string
	// MemoryDir is the box's memory cgroup directory and MemoryV2 whether
	// it is cgroup v2 (which OOM-kills instead of refusing a limit below
	// usage, so Apply refuses it first).
	MemoryDir string
	MemoryV2  bool
	// CheckPids refuses a pids limit below what the box runs (FailedPrecondition).
	CheckPids func(limit int64) error
	// SetMemory, SetPids and SetCPU write one limit, pushing the
	// restoration of every file they changed onto undo.
	SetMemory, SetPids, SetCPU func(v int64, undo *cleanup.Stack) error
}

// CheckResources refuses negative limits (zero fields are left as they are).
func CheckResources(id string, r runtime.Resources) error {
	if r.MemoryBytes < 0 || r.CPUMillis < 0 || r.Pids < 0 || r.DiskBytes < 0 {
		return fmt.Errorf("update box %s: negative limit in %+v: %w", id, r, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Apply changes the limits r sets (zero fields are left as they are).
// Everything that can be checked up front is (disk and pids in use, memory
// on cgroup v2), so a limit below use fails before anything changes; a
// limit the kernel refuses while applying (a v1 memory limit it cannot
// reclaim down to) rolls back the limits already changed. The error names
// the limit that could not be set.
func (l Limits) Apply(r runtime.Resources) (err error) {
	var undo cleanup.Stack
	defer func() {
		if err != nil {
			if uerr := undo.Run(); uerr != nil {
				err = errors.Join(err, fmt.Errorf("rolling back: %w", uerr))
			}
			err = fmt.Errorf("update box %s: %w", l.ID, err)
		}
	}()
	// Checks first: nothing has changed yet if one fails.
	var disk *Tmpfs
	if r.DiskBytes > 0 {
		if disk, err = CheckDisk(l.WritableLayer, r.DiskBytes); err != nil {
			return err
		}
	}
	if r.Pids > 0 {
		if err := l.CheckPids(r.Pids); err != nil {
			return err
		}
	}
	if r.MemoryBytes > 0 && l.MemoryV2 {
		used := ReadCgroupInt(filepath.Join(l.MemoryDir, "memory.current")) - ReadCgroupKey(filepath.Join(l.MemoryDir, "memory.stat"), "inactive_file")
		if used > r.MemoryBytes {
			return fmt.Errorf("memory limit: cannot lower to %d bytes, the box uses %d bytes that cannot be reclaimed: %w",
				r.MemoryBytes, used, errdefs.ErrFailedPrecondition)
		}
	}

	// Then apply, most likely to be refused first.
	if r.MemoryBytes > 0 {
		if err := l.SetMemory(r.MemoryBytes, &undo); err != nil {
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
		if err := l.SetPids(r.Pids, &undo); err != nil {
			return err
		}
	}
	if r.CPUMillis > 0 {
		if err := l.SetCPU(r.CPUMillis, &undo); err != nil {
			return fmt.Errorf("cpu limit: %w", err)
		}
	}
	return nil
}
