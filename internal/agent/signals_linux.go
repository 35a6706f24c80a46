package agent

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// harden protects the agent from user code running as the same uid in the
// same pid namespace: it cannot be ptraced or have its memory read, and no
// signal that can be caught stops it (Go's default for SIGTERM, SIGQUIT and
// friends is to exit). SIGKILL and SIGSTOP are not delivered to a pid
// namespace's init from inside it anyway.
func harden() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE): %w", err)
	}
	var sigs []os.Signal
	for n := 1; n <= 64; n++ {
		switch syscall.Signal(n) {
		case unix.SIGKILL, unix.SIGSTOP, unix.SIGCHLD, unix.SIGURG:
			// Uncatchable, owned by the reaper, or the runtime's preemption.
			continue
		}
		if n == 32 || n == 33 {
			continue // reserved by libc threading
		}
		sigs = append(sigs, syscall.Signal(n))
	}
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, sigs...)
	go func() {
		for range ch {
		}
	}()
	return nil
}

// closeOnExecAll marks every inherited fd above stderr close-on-exec, so a
// descriptor the runtime leaked into the agent never reaches user code.
func closeOnExecAll() {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 2 {
			continue
		}
		unix.CloseOnExec(fd)
	}
}
