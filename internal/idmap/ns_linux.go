package idmap

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// secbitNoSetuidFixup keeps a thread's capabilities across a change of its
// effective or filesystem uid (capabilities(7), SECBIT_NO_SETUID_FIXUP).
const secbitNoSetuidFixup = 1 << 2

// BoxNamespace creates the user namespace of a box with range r: box ids
// 0..r.Size-1 map to r, and its owner is r.Base, not the caller, so the
// kernel charges what the box's processes count in ucounts (inotify,
// RLIMIT_SIGPENDING, RLIMIT_NPROC, user namespaces...) to host uid r.Base
// at every level above the box, never to host root, and all of it
// together is bounded by lim (see Limits), in a parent namespace of the
// box's own. The namespace is bind-mounted at path (an existing empty
// file) and stays there until path is unmounted. exe is the binary whose
// first argument HelperArg runs Helper (the agent), reachable and
// executable by r.Base.
func BoxNamespace(r Range, exe, path string, lim Limits) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		errc <- boxNamespace(r, exe, path, lim)
	}()
	return <-errc
}

// ShiftNamespace returns a user namespace that maps Canonical to r: an
// idmapped mount through it shows a tree stored in Canonical in r. The
// caller closes it (mounts made with it keep their own reference).
func ShiftNamespace(r Range, exe string) (*os.File, error) {
	m := fmt.Sprintf("%d %d %d\n", Canonical.Base, r.Base, min(r.Size, Canonical.Size))
	var out *os.File
	err := withNamespace(exe, m, func(pid int) error {
		f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/user")
		if err != nil {
			return fmt.Errorf("open user namespace: %w", err)
		}
		out = f
		return nil
	})
	return out, err
}

// withNamespace starts a helper in a new user namespace, writes idMap as
// its uid and gid map, calls use with its pid and kills it.
//
// The helper is exe run under ptrace: it stops at its exec and never runs a
// line of exe. It is forked from a thread locked for the purpose (the
// tracer), which exits with the goroutine. The maps are written from
// another thread.
func withNamespace(exe, idMap string, use func(pid int) error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		errc <- forkNamespace(exe, idMap, use)
	}()
	return <-errc
}

func forkNamespace(exe, idMap string, use func(pid int) error) error {
	cmd := exec.Command(exe)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER, Ptrace: true, Pdeathsig: unix.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start user namespace helper: %w", err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	pid := cmd.Process.Pid
	done := make(chan error, 1)
	go func() { // a thread with the daemon's credentials
		proc := "/proc/" + strconv.Itoa(pid)
		for _, f := range []string{"uid_map", "gid_map"} {
			if err := os.WriteFile(proc+"/"+f, []byte(idMap), 0); err != nil {
				done <- fmt.Errorf("write %s of user namespace: %w", f, err)
				return
			}
		}
		done <- use(pid)
	}()
	return <-done
}

// setThreadIDs sets the calling thread's effective (or, with fsOnly, only
// filesystem) uid and gid to id, keeping its capabilities. The thread must
// be locked and never unlocked.
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
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if err := setThreadIDs(int(r.Base), true); err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	return <-errc
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
