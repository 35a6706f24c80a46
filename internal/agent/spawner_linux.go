package agent

import (
	"fmt"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// spawner forks every user process from one OS thread of the agent that
// lives in the box's user cgroups (see internal/runtime/oci/usercgroup.go):
// a fork inherits the forking thread's cgroups, so user processes are born
// there, beside the agent rather than with it, and user code's OOM kills and
// fork bombs stay among user processes. cgroup v1 has no CLONE_INTO_CGROUP
// but lets one thread live in another cgroup than its process; moving the
// thread once costs one cgroup write, where moving each child would cost one
// (and a cgroup-wide write lock) per exec. The agent's memory stays charged
// to its own cgroup: memory is charged by process, not by thread.
//
// The Go runtime never starts a thread from a locked one (it asks its
// template thread instead), so no other thread of the agent lands there.
type spawner struct {
	reqs chan func()
}

// newSpawner starts the spawner's thread and moves it into the cgroups
// whose `tasks` files are the inherited fds (opened by the driver as host
// root: the kernel checks the opener's credentials, box root could not move
// anything there itself). The fds are closed once used. A failure is fatal
// to the agent: a box whose user code could take the agent's memory and
// pids must not start.
func newSpawner(fds []int) (*spawner, error) {
	sp := &spawner{reqs: make(chan func())}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with the goroutine, which serves
		// for the agent's life.
		runtime.LockOSThread()
		tid := strconv.Itoa(unix.Gettid())
		var err error
		for _, fd := range fds {
			f := os.NewFile(uintptr(fd), "user-cgroup")
			if f == nil {
				err = fmt.Errorf("user cgroup fd %d is not valid", fd)
				continue
			}
			if err == nil {
				if _, werr := f.WriteString(tid); werr != nil {
					err = fmt.Errorf("joining user cgroup (fd %d): %w", fd, werr)
				}
			}
			f.Close()
		}
		errc <- err
		if err != nil {
			return
		}
		for fn := range sp.reqs {
			fn()
		}
	}()
	if err := <-errc; err != nil {
		return nil, err
	}
	return sp, nil
}

// fork runs fn (a fork) on the spawner's thread, or on the caller's if sp is
// nil (no user cgroups: tests, drivers that do not make them).
func (sp *spawner) fork(fn func() (int, error)) (int, error) {
	if sp == nil {
		return fn()
	}
	type result struct {
		pid int
		err error
	}
	ch := make(chan result, 1)
	sp.reqs <- func() {
		pid, err := fn()
		ch <- result{pid, err}
	}
	r := <-ch
	return r.pid, r.err
}
