package ocibox

import (
	goruntime "runtime"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sbxdev/sbx/internal/seccomp"
)

// Seccomp is the box's default seccomp profile (seccomp.Default, which
// says what it denies and why) as the runtime spec's seccomp section. The
// oci driver gives it to the runtime only where the agent cannot install
// it itself; runsc installs it in gVisor's kernel (--oci-seccomp), so it
// filters the box's syscalls to the sentry, not the sentry's to the host
// (runsc has its own host filter for those).
func Seccomp() *specs.LinuxSeccomp {
	return specSeccomp(seccomp.Default())
}

// specSeccomp translates p. The unconditional allowlist comes first, then
// each rule as its own entry, in order; names with no number on the native
// architecture are left out of the allowlist (see seccompArches).
func specSeccomp(p seccomp.Profile) *specs.LinuxSeccomp {
	deflt := uint(p.DefaultErrno)
	s := &specs.LinuxSeccomp{
		DefaultAction:   specs.ActErrno,
		DefaultErrnoRet: &deflt,
		Architectures:   seccompArches(),
		Syscalls: []specs.LinuxSyscall{
			{Names: nativeSyscalls(p.Allow), Action: specs.ActAllow},
		},
	}
	for _, r := range p.Rules {
		sc := specs.LinuxSyscall{Names: []string{r.Name}, Action: specs.ActAllow}
		switch r.Op {
		case seccomp.OpMaskedZero:
			sc.Args = []specs.LinuxSeccompArg{{Index: r.Index, Value: r.Value, ValueTwo: 0, Op: specs.OpMaskedEqual}}
		case seccomp.OpEqual:
			sc.Args = []specs.LinuxSeccompArg{{Index: r.Index, Value: r.Value, Op: specs.OpEqualTo}}
		case seccomp.OpErrno:
			errno := uint(r.Errno)
			sc.Action, sc.ErrnoRet = specs.ActErrno, &errno
		}
		s.Syscalls = append(s.Syscalls, sc)
	}
	return s
}

// seccompArches lists only the native architecture: syscalls made through a
// compat ABI (32-bit int 0x80, x32) are refused. That closes an often-buggy
// kernel entry path and costs nothing on hosts without 32-bit libraries; it
// also roughly halves the time the runtime spends compiling the filter
// (about 20 ms of runc's start on this machine with three x86 arches).
func seccompArches() []specs.Arch {
	switch goruntime.GOARCH {
	case "amd64":
		return []specs.Arch{specs.ArchX86_64}
	case "arm64":
		return []specs.Arch{specs.ArchAARCH64}
	}
	return nil // the runtime's native arch only
}

// nativeSyscalls drops the names that have no number on the native
// architecture. The runtime would ignore them anyway (the filter covers the
// native arch only, see seccompArches), so the compiled filter is the same;
// but every name is resolved, and ignored, by the runtime's libseccomp again
// in the box's init on each start, and they make up a fifth of the list: on
// amd64, leaving them out takes about 4-5 ms off `runc run` here.
func nativeSyscalls(names []string) []string {
	return seccomp.NativeNames(names)
}
