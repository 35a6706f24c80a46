package agent

import (
	"errors"
	"fmt"
	goruntime "runtime"
	"syscall"
	"unsafe"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/agent/permfs"
	"github.com/sbxdev/sbx/internal/permrules"
)

// Path guards and the lockdown.
//
// The box starts the agent with CAP_SYS_ADMIN (in the sandbox's user
// namespace) only so that it can mount the permission layers (FUSE) of
// Configure's path policies. Before any user process can start — at the
// end of Configure or just before the first spawn, whichever comes first —
// the agent drops CAP_SYS_ADMIN from every set of every one of its threads
// (user processes inherit the forking thread's bounding set, and as uid 0
// of the namespace would otherwise regain it on execve), so no process in
// the sandbox can unmount a guard or mount anything. The agent is
// non-dumpable (harden), so user processes, though of the same uid, cannot
// reach the backing trees through /proc/1/{fd,root,cwd} (that needs
// CAP_SYS_PTRACE, which boxes never have). After the lockdown no more guards
// can be mounted.

// lockdownState is the part of Server the lockdown needs.
type lockdownState struct {
	// enabled: drop CAP_SYS_ADMIN before spawning (set by Run; the unit
	// tests' agents run in the test process and must not drop its caps).
	enabled bool
	// done is set once CAP_SYS_ADMIN is gone (or enabled is false and a
	// process was spawned); err is the drop's failure, which refuses every
	// later spawn.
	done bool
	err  error
	// guards are the mounted permission layers.
	guards []*permfs.Guard
}

// lockdown drops CAP_SYS_ADMIN once. It is called before every spawn and at
// the end of Configure; an error must stop the spawn.
func (s *Server) lockdown() error {
	s.lockMu.Lock()
	defer s.lockMu.Unlock()
	return s.lockdownLocked()
}

func (s *Server) lockdownLocked() error {
	if s.lock.done {
		return s.lock.err
	}
	s.lock.done = true
	if s.lock.enabled {
		// The filter first: installing it needs no_new_privs (boxes have
		// it) or CAP_SYS_ADMIN, which we still hold.
		s.lock.err = denyMounts()
		if s.lock.err == nil {
			s.lock.err = dropSysAdmin()
		}
		if s.lock.err != nil {
			s.log.Error("dropping CAP_SYS_ADMIN; no process will be started", "err", s.lock.err)
		} else {
			s.log.Info("dropped CAP_SYS_ADMIN", "guards", len(s.lock.guards))
		}
	}
	return s.lock.err
}

// mountGuards validates and mounts policies. It fails if the lockdown
// happened already. On failure the guards mounted by this call are
// unmounted again.
func (s *Server) mountGuards(ps []*sbxv1.PathPolicy) error {
	if len(ps) == 0 {
		return nil
	}
	pols, err := permrules.CheckPolicies(ps)
	if err != nil {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("configure: %w", err))
	}
	s.lockMu.Lock()
	defer s.lockMu.Unlock()
	if s.lock.done {
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("configure: path policies must be set before any process starts"))
	}
	for _, g := range s.lock.guards {
		for _, p := range pols {
			if g.Path == p.Path {
				return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("configure: %s is guarded already", p.Path))
			}
		}
	}
	var mounted []*permfs.Guard
	for _, p := range pols {
		g, err := permfs.Mount(p, s.log)
		if err != nil {
			for _, m := range mounted {
				if uerr := m.Unmount(); uerr != nil {
					s.log.Error("unmounting guard after a failed configure", "path", m.Path, "err", uerr)
				}
			}
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("configure: guarding %s: %w", p.Path, err))
		}
		mounted = append(mounted, g)
		s.log.Info("guarded", "path", p.Path)
	}
	s.lock.guards = append(s.lock.guards, mounted...)
	return nil
}

// dropSysAdmin removes CAP_SYS_ADMIN from the bounding, ambient, effective,
// permitted and inheritable sets of every thread of the process. It needs a
// binary built with CGO_ENABLED=0 (syscall.AllThreadsSyscall).
func dropSysAdmin() error {
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, unix.CAP_SYS_ADMIN, 0); e != 0 {
		return fmt.Errorf("prctl(PR_CAPBSET_DROP): %w", e)
	}
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); e != 0 {
		return fmt.Errorf("prctl(PR_CAP_AMBIENT_CLEAR_ALL): %w", e)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	bit := uint32(1) << (unix.CAP_SYS_ADMIN % 32)
	i := unix.CAP_SYS_ADMIN / 32
	data[i].Effective &^= bit
	data[i].Permitted &^= bit
	data[i].Inheritable &^= bit
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capset: %w", e)
	}
	return nil
}

// denyMounts stacks a seccomp filter on every thread that fails mount and
// umount2 with EPERM: defence in depth behind the dropped capability, and
// inherited by every process the agent starts.
func denyMounts() error {
	arch, ok := auditArch[goruntime.GOARCH]
	if !ok {
		return nil // the box's own profile still stands
	}
	const (
		ldAbs  = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeqK   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		retK   = unix.BPF_RET | unix.BPF_K
		allow  = unix.SECCOMP_RET_ALLOW
		eperm  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		nrOff  = 0
		archOf = 4
	)
	prog := []unix.SockFilter{
		{Code: ldAbs, K: archOf},
		{Code: jeqK, Jt: 1, Jf: 0, K: arch},
		{Code: retK, K: allow}, // other arches: the box's profile denies them
		{Code: ldAbs, K: nrOff},
		{Code: jeqK, Jt: 2, Jf: 0, K: unix.SYS_MOUNT},
		{Code: jeqK, Jt: 1, Jf: 0, K: unix.SYS_UMOUNT2},
		{Code: retK, K: allow},
		{Code: retK, K: eperm},
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	_, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	if e != 0 {
		return fmt.Errorf("seccomp(SET_MODE_FILTER, TSYNC): %w", e)
	}
	return nil
}

var auditArch = map[string]uint32{
	"amd64": unix.AUDIT_ARCH_X86_64,
	"arm64": unix.AUDIT_ARCH_AARCH64,
}
