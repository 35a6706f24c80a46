package idmap

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/osthread"
)

// secbitNoSetuidFixup keeps a thread's capabilities across a change of its
// effective or filesystem uid (capabilities(7), SECBIT_NO_SETUID_FIXUP).
const secbitNoSetuidFixup = 1 << 2

// BoxNamespace creates the user namespace of a box with range r: box ids
// 0..n-1 map to r (n is r.Size, at most Canonical.Size), and its owner is
// r.Base, not the caller, so the kernel charges what the box's processes
// count in ucounts (inotify, RLIMIT_SIGPENDING, RLIMIT_NPROC, user
// namespaces...) to host uid r.Base at every level above the box, never
// to host root, and all of it together is bounded by lim (see Limits), in
// a parent namespace of the box's own. The namespace is bind-mounted at
// path (an existing empty file) and stays there until path is unmounted.
// exe is the binary whose first argument HelperArg runs Helper (the
// agent), reachable and executable by r.Base.
//
// It returns the box's parent namespace, which maps Canonical to r: an
// idmapped mount through it (Mount) shows a tree stored in Canonical in
// r. The caller closes it (mounts made with it keep their own reference).
// A process in the box sees its ids map to Canonical, not to r.
func BoxNamespace(r Range, exe, path string, lim Limits) (*os.File, error) {
	type result struct {
		parent *os.File
		err    error
	}
	done := make(chan result, 1)
	// The thread's credentials change: one of its own, thrown away after.
	osthread.Go(func() {
		f, end, err := boxNamespace(r, exe, path, lim)
		done <- result{f, err}
		if end != nil {
			end() // off the caller's path
		}
	})
	res := <-done
	return res.parent, res.err
}

// setThreadIDs sets the calling thread's effective (or, with fsOnly, only
// filesystem) uid and gid to id, keeping its capabilities. The thread must
// be one of osthread's (locked, thrown away after).
func setThreadIDs(id int, fsOnly bool) error {
	if _, _, e := unix.RawSyscall6(unix.SYS_PRCTL, unix.PR_SET_SECUREBITS, secbitNoSetuidFixup, 0, 0, 0, 0); e != 0 {
		return fmt.Errorf("keep capabilities across setuid: %w", e)
	}
	if fsOnly {
		// setfs[ug]id return the previous id, never an error: check after.
		unix.RawSyscall(unix.SYS_SETFSGID, uintptr(id), 0, 0)
		unix.RawSyscall(unix.SYS_SETFSUID, uintptr(id), 0, 0)
		if prev, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, ^uintptr(0), 0, 0); int(prev) != id {
			return fmt.Errorf("set filesystem uid %d: got %d", id, prev)
		}
		return nil
	}
	keep := ^uintptr(0) // -1: unchanged
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keep, uintptr(id), keep); e != 0 {
		return fmt.Errorf("set effective gid %d: %w", id, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(id), keep); e != 0 {
		return fmt.Errorf("set effective uid %d: %w", id, e)
	}
	return nil
}

// AsBox runs f on a thread whose filesystem uid and gid are r.Base (box
// root), with the caller's capabilities. Files f creates are owned by box
// root; an overlay f mounts does its copy-ups and whiteouts as box root, as
// an overlay over idmapped layers must (host root has no id in them).
func AsBox(r Range, f func() error) error {
	// The thread's filesystem ids change: one of its own, thrown away after.
	return osthread.Run(func() error {
		if err := setThreadIDs(int(r.Base), true); err != nil {
			return err
		}
		return f()
	})
}

// ErrNotSupported is returned by Mount when the filesystem under src
// cannot be idmapped.
var ErrNotSupported = errors.New("idmapped mounts not supported by this filesystem")

// Mount attaches at dst an idmapped copy of the mount tree at src (its
// submounts too if recursive), seen through userns (a ShiftNamespace).
func Mount(src, dst string, userns *os.File, recursive bool) error {
	flags := uint(unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC)
	if recursive {
		flags |= unix.AT_RECURSIVE
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, flags)
	if err != nil {
		return fmt.Errorf("clone mount %s: %w", src, err)
	}
	defer unix.Close(fd)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(userns.Fd())}
	if recursive {
		err = unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr)
	} else {
		err = unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr)
	}
	if err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("idmap mount of %s: %w (%w)", src, ErrNotSupported, err)
		}
		return fmt.Errorf("idmap mount of %s: %w", src, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach idmapped mount at %s: %w", dst, err)
	}
	return nil
}
