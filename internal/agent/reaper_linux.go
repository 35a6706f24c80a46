package agent

import (
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// exitStatus is what the reaper learned about one child.
type exitStatus struct {
	ws     unix.WaitStatus
	rusage unix.Rusage
}

// reaper owns wait4 for the whole agent. Children are never waited for with
// os/exec: as PID 1 the agent must reap every zombie (orphans are re-parented
// to it), and a wait4(-1) loop would race any other waiter. Instead one
// goroutine waits and hands each status to the waiter registered for its pid.
//
// With all set (the agent is PID 1 or a subreaper) it calls wait4(-1) and so
// also reaps orphans; otherwise (unit tests inside a bigger process) it only
// waits for pids it started, so it never steals another package's children.
type reaper struct {
	all bool
	log *slog.Logger

	// mu guards the maps; start runs under it so a pid is registered before
	// the reaper can see it exit.
	mu sync.Mutex
	// waiters maps a started pid to the channel its exit status goes to.
	// Because fork and registration happen under mu and wait4 only runs under
	// mu, a child can never be reaped before it is registered; statuses of
	// unregistered pids are orphans and are dropped (keeping them would hand a
	// stale status to a later child that reuses the pid).
	waiters map[int]chan exitStatus
}

func newReaper(all bool, log *slog.Logger) *reaper {
	r := &reaper{
		all:     all,
		log:     log,
		waiters: make(map[int]chan exitStatus),
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	go func() {
		for range sigs {
			r.reap()
		}
	}()
	return r
}

// start runs fork (which returns the new child's pid) and registers the pid
// atomically with respect to the reaper. The returned channel receives the
// child's exit status exactly once.
func (r *reaper) start(fork func() (int, error)) (int, <-chan exitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan exitStatus, 1)
	r.waiters[pid] = ch
	return pid, ch, nil
}

// poll reaps pid now if it is a registered child that has exited (its status
// goes to its waiter as usual); a no-op otherwise. A caller that knows the
// child is about to exit or has exited (its output pipes closed) gets the
// status without the detour of SIGCHLD through the signal goroutine.
func (r *reaper) poll(pid int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.waiters[pid]; !ok {
		return
	}
	var st exitStatus
	got, err := unix.Wait4(pid, &st.ws, unix.WNOHANG, &st.rusage)
	for err == unix.EINTR {
		got, err = unix.Wait4(pid, &st.ws, unix.WNOHANG, &st.rusage)
	}
	if err == nil && got == pid {
		r.deliverLocked(pid, st)
	}
}

func (r *reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reapLocked()
}

func (r *reaper) reapLocked() {
	if r.all {
		for {
			var st exitStatus
			pid, err := unix.Wait4(-1, &st.ws, unix.WNOHANG, &st.rusage)
			if err == unix.EINTR {
				continue
			}
			if err != nil || pid <= 0 {
				return // ECHILD: no children; 0: none has exited
			}
			r.deliverLocked(pid, st)
		}
	}
	// Only our own children, one by one.
	for pid := range r.waiters {
		var st exitStatus
		got, err := unix.Wait4(pid, &st.ws, unix.WNOHANG, &st.rusage)
		for err == unix.EINTR {
			got, err = unix.Wait4(pid, &st.ws, unix.WNOHANG, &st.rusage)
		}
		if err == unix.ECHILD {
			// Somebody else reaped it; report a plain failure rather than hang.
			st.ws = unix.WaitStatus(255 << 8)
			got = pid
		} else if err != nil || got <= 0 {
			continue
		}
		r.deliverLocked(got, st)
	}
}

func (r *reaper) deliverLocked(pid int, st exitStatus) {
	if st.ws.Stopped() || st.ws.Continued() {
		return
	}
	if ch, ok := r.waiters[pid]; ok {
		delete(r.waiters, pid)
		ch <- st
		return
	}
	r.log.Debug("reaped orphan", "pid", pid, "status", int(st.ws))
}
