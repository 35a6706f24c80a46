//go:build linux

package pidwatch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func signalName(sig syscall.Signal) string { return unix.SignalName(sig) }

// StartTime is field 22 of /proc/pid/stat (0 if pid is gone): with the pid
// it identifies a process across pid reuse. A zombie keeps it.
func StartTime(pid int) uint64 {
	f := statFields(pid)
	if len(f) < 20 {
		return 0
	}
	n, _ := strconv.ParseUint(f[19], 10, 64)
	return n
}

// statFields are the fields of /proc/pid/stat from field 3 (state) on, or
// nil if pid is gone.
func statFields(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}

// GoneOrZombie reports whether pid has exited.
func GoneOrZombie(pid int) bool {
	f := statFields(pid)
	return len(f) == 0 || f[0] == "Z" || f[0] == "X"
}

// Kill sends SIGKILL to process pid, started at start (StartTime), through
// a pidfd, so a reused pid is never signalled: a process already gone (or
// whose pid now belongs to another) is no error.
func Kill(pid int, start uint64) error {
	if pid <= 0 || start == 0 {
		return fmt.Errorf("kill pid %d: no process recorded: %w", pid, errors.ErrUnsupported)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pidfd_open(%d): %w", pid, err)
	}
	defer unix.Close(fd)
	// Checked after the pidfd is open: it refers to the very process whose
	// start time matched, even if the pid is reused later.
	if StartTime(pid) != start {
		return nil
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill pid %d: %w", pid, err)
	}
	return nil
}

// Watch calls conv once process pid, started at start (StartTime), has
// exited, and sends what it returns on the channel, which is then closed.
// If the process is gone already, the value is in the channel when Watch
// returns, so a non-blocking receive right after tells. conv runs on the
// watching goroutine (or in Watch), so it may read what the exit changed
// (a cgroup's OOM count). The watch ends, the channel closed without a
// value, once ctx is done.
//
// The status comes from waitid(P_PIDFD, WNOWAIT) when the process is this
// process's child, leaving the zombie, and with it the pid, to whoever
// reaps it (Reap); otherwise from the zombie's /proc/pid/stat if its parent
// has not reaped it yet, and is Unknown after that.
func Watch[T any](ctx context.Context, pid int, start uint64, conv func(Status) T) (<-chan T, error) {
	if pid <= 0 || start == 0 {
		return nil, fmt.Errorf("watch pid %d: no process recorded: %w", pid, errors.ErrUnsupported)
	}
	ch := make(chan T, 1)
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	switch {
	case errors.Is(err, unix.ESRCH):
		ch <- conv(Status{Unknown: "gone (reaped before it was watched; status unknown)"})
		close(ch)
		return ch, nil
	case err != nil:
		return nil, fmt.Errorf("pidfd_open(%d): %w", pid, err)
	}
	// Checked after the pidfd is open: the pidfd then refers to the very
	// process whose start time matched, even if the pid is reused later.
	if StartTime(pid) != start {
		unix.Close(fd)
		ch <- conv(Status{Unknown: "gone (its pid now belongs to another process; status unknown)"})
		close(ch)
		return ch, nil
	}
	f := os.NewFile(uintptr(fd), "pidfd:"+strconv.Itoa(pid))
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("watch pid %d: %w", pid, err)
	}
	if pidfdReady(fd) {
		ch <- conv(exitStatus(fd, pid, start))
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
		// says the pidfd is readable; it then runs again. It fails only
		// once ctx set the deadline.
		if err := rc.Read(func(uintptr) bool { return pidfdReady(fd) }); err != nil {
			return
		}
		ch <- conv(exitStatus(fd, pid, start))
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
func exitStatus(fd, pid int, start uint64) Status {
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
					return Status{Code: int(si.Status)}
				case cldKilled, cldDumped:
					return Status{Signal: int(si.Status)}
				}
			}
		}
		break
	}
	// Not our child (recovered after a restart): its zombie may still say.
	if ws, ok := zombieStatus(pid, start); ok {
		if ws.Signaled() {
			return Status{Signal: int(ws.Signal())}
		}
		return Status{Code: ws.ExitStatus()}
	}
	return Status{Unknown: "exited; status unknown (not this daemon's child, already reaped)"}
}

// zombieStatus reads the wait status of a zombie from /proc/pid/stat
// (field 52, exit_code), if pid is still the zombie started at start.
func zombieStatus(pid int, start uint64) (unix.WaitStatus, bool) {
	f := statFields(pid) // f[0] is field 3 (state)
	if len(f) < 50 || f[0] != "Z" || f[19] != strconv.FormatUint(start, 10) {
		return 0, false
	}
	n, err := strconv.ParseUint(f[49], 10, 32)
	if err != nil {
		return 0, false
	}
	return unix.WaitStatus(n), true
}

// Reap waits up to timeout for pid to exit and reaps it if it is this
// process's child (a subreaper adopts its descendants' orphans). It never
// waits for any other process: a pid that is not our child (a box
// recovered after a restart) is waited for until it is gone or a zombie.
func Reap(pid int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	delay := 20 * time.Microsecond
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ECHILD):
			if GoneOrZombie(pid) {
				return nil
			}
		case err != nil:
			return fmt.Errorf("wait for pid %d: %w", pid, err)
		case got == pid:
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pid %d still alive after %v", pid, timeout)
		}
		time.Sleep(delay)
		if delay < 5*time.Millisecond {
			delay *= 2
		}
	}
}

// ReapIfOurs reaps pid if it is this process's child started at start
// (checked first, so a reused pid, perhaps another child of ours whose
// status someone else waits for, is left alone), waiting up to timeout for
// it to exit. A pid that is gone, not ours or reused is no error.
func ReapIfOurs(pid int, start uint64, timeout time.Duration) error {
	if pid <= 0 || start == 0 || StartTime(pid) != start || !childOfUs(pid) {
		return nil
	}
	// While it is our child, unreaped, its pid cannot be reused.
	return Reap(pid, timeout)
}

// childOfUs reports whether pid's parent is this process.
func childOfUs(pid int) bool {
	f := statFields(pid) // f[1] is field 4 (ppid)
	return len(f) > 1 && f[1] == strconv.Itoa(os.Getpid())
}

// ChildrenOf lists the pids in pids whose parent is this process, with
// their start times.
func ChildrenOf(pids []int) map[int]uint64 {
	out := map[int]uint64{}
	me := strconv.Itoa(os.Getpid())
	for _, pid := range pids {
		f := statFields(pid)
		if len(f) < 20 || f[1] != me {
			continue
		}
		if n, err := strconv.ParseUint(f[19], 10, 64); err == nil && n != 0 {
			out[pid] = n
		}
	}
	return out
}
