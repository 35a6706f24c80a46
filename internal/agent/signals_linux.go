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
// same pid namespace: it cannot be ptraced or have its memory read, its
// resource limits cannot be changed (prlimit), and no signal that can be
// caught stops it. SIGKILL and SIGSTOP are not delivered to a pid
// namespace's init from inside it anyway.
func harden() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE): %w", err)
	}
	// prlimit(2) on another process needs CAP_SYS_RESOURCE (which sandbox
	// root lacks) unless the caller's real uid equals the target's real,
	// effective and saved uids. A saved uid no user process holds as its
	// real uid at the same time as 0 makes that impossible, so user code
	// cannot lower the agent's RLIMIT_NOFILE or NPROC to starve it. The
	// agent keeps its real and effective uid 0, and with them its
	// capabilities; children get all three back to their user's (see
	// userInfo.credential).
	if err := unix.Setresuid(-1, -1, agentSavedUID); err != nil {
		return fmt.Errorf("setresuid(saved %d): %w", agentSavedUID, err)
	}
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, fatalSignals...)
	go func() {
		for range ch {
		}
	}()
	return nil
}

// setNoFile sets the agent's RLIMIT_NOFILE, which every process it starts
// inherits: soft and hard to n (at most the hard limit it inherited: only
// CAP_SYS_RESOURCE in the host's namespace may raise it), or, with n 0,
// the soft one up to the hard one. The OCI runtime cannot set it for a box
// whose user namespace host root does not own, so the driver hands the
// box's limit over as --nofile. Lowering one's own limits needs no
// privilege; user code cannot change the agent's afterwards (harden).
// syscall.Setrlimit, not x/sys/unix: it also stops Go from giving children
// its own original soft limit back.
func setNoFile(n uint64) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("get RLIMIT_NOFILE: %w", err)
	}
	if n > 0 {
		lim.Max = min(lim.Max, n)
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("set RLIMIT_NOFILE to %d: %w", lim.Max, err)
	}
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
// agentSavedUID is the agent's saved uid (nobody): any uid other than 0
// mapped in every sandbox's user namespace.
const agentSavedUID = 65534

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
