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
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/runtime"
)

var _ runtime.Watcher = (*Driver)(nil)

// Watch reports when the box's init (the agent, PID 1 of the box) exits
// (runtime.Watcher). It opens a pidfd for the init recorded at create
// (pid and start time, so a reused pid is never mistaken for it) and parks a
// goroutine on it in Go's netpoller: the pidfd becomes readable when the
// process exits, no thread is held and nothing polls /proc. If the init is
// already gone, the Exit is in the channel before Watch returns.
//
// The exit status comes from waitid(P_PIDFD, WNOWAIT) when the init is this
// process's child (we are the subreaper that adopted it at create), leaving
// the zombie, and with it the pid, to Destroy's reap. A box recovered after
// a restart is not our child: its status is then read from the zombie's
// /proc/<pid>/stat if whoever adopted it has not reaped it yet, and
// reported as unknown otherwise.
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
	ch := make(chan runtime.Exit, 1)
	oomBase := d.cg.ownOOMKills(h.ID)
	fd, err := unix.PidfdOpen(data.Pid, unix.PIDFD_NONBLOCK)
	switch {
	case errors.Is(err, unix.ESRCH):
		ch <- runtime.Exit{Reason: "gone (reaped before it was watched; status unknown)"}
		close(ch)
		return ch, nil
	case err != nil:
		return nil, fmt.Errorf("watch box %s: pidfd_open(%d): %w", h.ID, data.Pid, err)
	}
	// Checked after the pidfd is open: the pidfd then refers to the very
	// process whose start time matched, even if the pid is reused later.
	if procStartTime(data.Pid) != data.StartTime {
		unix.Close(fd)
		ch <- runtime.Exit{Reason: "gone (its pid now belongs to another process; status unknown)"}
		close(ch)
		return ch, nil
	}
	f := os.NewFile(uintptr(fd), "pidfd:"+strconv.Itoa(data.Pid))
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("watch box %s: %w", h.ID, err)
	}
	exitOf := func() runtime.Exit {
		ex := exitStatus(fd, data.Pid, data.StartTime)
		if ex.Signal == int(unix.SIGKILL) && d.cg.ownOOMKills(h.ID) > oomBase {
			ex.OOMKilled = true
			ex.Reason = "OOM-killed (" + ex.Reason + ")"
		}
		return ex
	}
	if pidfdReady(fd) {
		ch <- exitOf()
		close(ch)
		f.Close()
		return ch, nil
	}
	go func() {
		defer close(ch)
		defer f.Close()
		stop := context.AfterFunc(ctx, func() { _ = f.SetReadDeadline(time.Unix(1, 0)) })
		defer stop()
		// Read's callback returning false parks this goroutine until epoll
		// says the pidfd is readable; it then runs again.
		err := rc.Read(func(uintptr) bool { return pidfdReady(fd) })
		if err != nil {
			if ctx.Err() == nil {
				d.log.Warn("watching box init", "id", h.ID, "pid", data.Pid, "err", err)
			}
			return
		}
		ch <- exitOf()
	}()
	return ch, nil
}

// pidfdReady reports whether the process behind pidfd has exited.
func pidfdReady(fd int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err == nil && n > 0 && fds[0].Revents&(unix.POLLIN|unix.POLLHUP) != 0
	}
}

// si_code values of SIGCHLD (asm-generic/siginfo.h).
const (
	cldExited = 1
	cldKilled = 2
	cldDumped = 3
)

// sigchld is the SIGCHLD layout of siginfo_t (unix.Siginfo hides it).
type sigchld struct {
	Signo, Errno, Code, _ int32
	Pid, UID, Status      int32
	_                     [100]byte
}

// exitStatus describes how the exited process behind pidfd ended.
func exitStatus(fd, pid int, start uint64) runtime.Exit {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PIDFD, fd, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err == nil {
			si := (*sigchld)(unsafe.Pointer(&info))
			if si.Pid != 0 {
				switch si.Code {
				case cldExited:
					return runtime.Exit{Reason: fmt.Sprintf("exited with status %d", si.Status)}
				case cldKilled, cldDumped:
					return signalExit(int(si.Status))
				}
			}
		}
		break
	}
	// Not our child (recovered after a restart): its zombie may still say.
	if ws, ok := zombieStatus(pid, start); ok {
		if ws.Signaled() {
			return signalExit(int(ws.Signal()))
		}
		return runtime.Exit{Reason: fmt.Sprintf("exited with status %d", ws.ExitStatus())}
	}
	return runtime.Exit{Reason: "exited; status unknown (not this daemon's child, already reaped)"}
}

func signalExit(sig int) runtime.Exit {
	return runtime.Exit{Reason: "killed by signal " + unix.SignalName(unix.Signal(sig)), Signal: sig}
}

// zombieStatus reads the wait status of a zombie from /proc/pid/stat
// (field 52, exit_code), if pid is still the zombie started at start.
func zombieStatus(pid int, start uint64) (unix.WaitStatus, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 50 || f[0] != "Z" || f[19] != strconv.FormatUint(start, 10) {
		return 0, false
	}
	n, err := strconv.ParseUint(f[49], 10, 32)
	if err != nil {
		return 0, false
	}
	return unix.WaitStatus(n), true
}

// ownOOMKills counts the OOM kills in the box cgroup itself, where the
// agent is, leaving out the user cgroup's (user code's).
func (l cgroupLayout) ownOOMKills(id string) int64 {
	mem, v2 := l.controllerDir("memory", id)
	if v2 {
		return readKey(filepath.Join(mem, "memory.events.local"), "oom_kill")
	}
	return readKey(filepath.Join(mem, "memory.oom_control"), "oom_kill")
}
