package seccomp

import (
	"fmt"
	goruntime "runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// Install sets no_new_privs and installs prog as a seccomp filter on every
// thread of the process (SECCOMP_FILTER_FLAG_TSYNC), so that it also binds
// every process started afterwards. Filters stack: prog is added to any the
// process has already, and can never be removed. With no_new_privs set no
// capability is needed.
func Install(prog []unix.SockFilter) error {
	if len(prog) == 0 || len(prog) > MaxInstructions {
		return fmt.Errorf("installing seccomp filter: %d instructions, want 1-%d: %w", len(prog), MaxInstructions, errdefs.ErrInvalidArgument)
	}
	// no_new_privs is per thread and seccomp checks the calling thread's:
	// both calls must run on the same one. TSYNC then sets no_new_privs on
	// the other threads too.
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("installing seccomp filter: prctl(PR_SET_NO_NEW_PRIVS): %w", err)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	r, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	goruntime.KeepAlive(prog)
	if e != 0 {
		return fmt.Errorf("installing seccomp filter: seccomp(SET_MODE_FILTER, TSYNC): %w", e)
	}
	if r != 0 {
		// TSYNC reports the id of a thread it could not synchronize (one
		// with an unrelated filter of its own); nothing was installed.
		return fmt.Errorf("installing seccomp filter: seccomp(SET_MODE_FILTER, TSYNC): thread %d could not be synchronized", r)
	}
	return nil
}
