package agent

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"

	"golang.org/x/sys/unix"
)

// harden protects the agent from user code running as the same uid in the
// same pid namespace: it cannot be ptraced or have its memory read, and no
// signal that can be caught stops it. SIGKILL and SIGSTOP are not delivered
// to a pid namespace's init from inside it anyway.
func harden() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE): %w", err)
	}
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, fatalSignals...)
	go func() {
		for range ch {
		}
	}()
	return nil
}

// fatalSignals are the signals that, sent with kill(2) to a Go program that
// does not ask for them, end it: Go exits on SIGHUP, SIGINT and SIGTERM,
// crashes on SIGQUIT, SIGILL, SIGTRAP, SIGABRT, SIGSTKFLT and SIGSYS and on
// the synchronous ones (SIGBUS, SIGFPE, SIGSEGV) when a process sends them,
// and leaves SIGTSTP, SIGTTIN and SIGTTOU at their default, stop (which the
// kernel ignores only for a pid namespace's init). Go drops the other
// signals a process sends unless asked for them, except 32 to 34, which it
// can neither catch nor ignore: like SIGKILL and SIGSTOP those only the
// kernel keeps from a pid namespace's init, which the agent is in a sandbox.
// Asking for every signal, as this once did, cost 1–2 ms of the agent's
// start: each signal.Notify of a new signal is a round trip with the
// runtime's signal thread. TestBinary sends every signal.
var fatalSignals = []os.Signal{
	unix.SIGHUP, unix.SIGINT, unix.SIGTERM,
	unix.SIGQUIT, unix.SIGILL, unix.SIGTRAP, unix.SIGABRT, unix.SIGSTKFLT, unix.SIGSYS,
	unix.SIGBUS, unix.SIGFPE, unix.SIGSEGV,
	unix.SIGTSTP, unix.SIGTTIN, unix.SIGTTOU,
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
