// Package seccomp owns the sandbox's default syscall filter: the profile (an
// arch-neutral allowlist with a few argument rules, and why each omission is
// there) and its compilation to a classic BPF program that a process can
// install on itself. The OCI driver turns the same profile into the runtime
// spec's seccomp section; the in-sandbox agent can install the compiled
// program directly. It imports only the standard library, x/sys and errdefs,
// so the agent may import it.
package seccomp

import (
	"fmt"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// Op says what a Rule does.
type Op int

const (
	// OpMaskedZero allows the syscall if args[Index] & Value == 0 (all 64
	// bits).
	OpMaskedZero Op = iota + 1
	// OpEqual allows the syscall if args[Index] == Value (all 64 bits).
	OpEqual
	// OpErrno fails the syscall with Errno, whatever its arguments.
	OpErrno
)

func (o Op) String() string {
	switch o {
	case OpMaskedZero:
		return "masked-zero"
	case OpEqual:
		return "equal"
	case OpErrno:
		return "errno"
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// Rule is an outcome for one syscall other than "allowed whatever the
// arguments". The allow rules (OpMaskedZero, OpEqual) of a syscall are
// alternatives: the syscall is allowed if any of them holds, and gets the
// profile's default action otherwise.
type Rule struct {
	Name  string
	Op    Op
	Index uint   // the argument checked, 0-5 (OpMaskedZero, OpEqual)
	Value uint64 // the mask (OpMaskedZero) or the value (OpEqual)
	Errno uint32 // OpErrno's errno, 1-4095
}

// Profile is a syscall allowlist. Every syscall not allowed fails with
// DefaultErrno, and so does every syscall made through an ABI other than
// the native one (see Compile).
type Profile struct {
	DefaultErrno uint32
	// Allow lists the syscalls allowed whatever their arguments. Names
	// that have no number on the architecture compiled for are skipped;
	// names unknown on every architecture are an error.
	Allow []string
	// Rules are the conditional and errno outcomes, in order.
	Rules []Rule
}

// maxErrno is the kernel's MAX_ERRNO; SECCOMP_RET_ERRNO clamps above it.
const maxErrno = 4095

// maxArgs is the number of syscall arguments in seccomp_data.
const maxArgs = 6

// check reports the first inconsistency in p: duplicate or conflicting
// entries would make the outcome of a syscall depend on rule order.
func (p Profile) check() error {
	if p.DefaultErrno == 0 || p.DefaultErrno > maxErrno {
		return fmt.Errorf("checking seccomp profile: default errno %d is not in 1-%d: %w", p.DefaultErrno, maxErrno, errdefs.ErrInvalidArgument)
	}
	allowed := make(map[string]bool, len(p.Allow))
	for _, n := range p.Allow {
		if n == "" {
			return fmt.Errorf("checking seccomp profile: empty syscall name in the allowlist: %w", errdefs.ErrInvalidArgument)
		}
		if allowed[n] {
			return fmt.Errorf("checking seccomp profile: %s is allowed twice: %w", n, errdefs.ErrInvalidArgument)
		}
		allowed[n] = true
	}
	ops := map[string]Op{}
	for i, r := range p.Rules {
		bad := func(format string, args ...any) error {
			return fmt.Errorf("checking seccomp profile: rule %d (%s %s): %s: %w", i, r.Name, r.Op, fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
		}
		if r.Name == "" {
			return bad("empty syscall name")
		}
		if allowed[r.Name] {
			return bad("the syscall is also allowed unconditionally")
		}
		switch r.Op {
		case OpMaskedZero, OpEqual:
			if r.Index >= maxArgs {
				return bad("argument index %d is not in 0-%d", r.Index, maxArgs-1)
			}
			if r.Errno != 0 {
				return bad("errno %d set on an allow rule", r.Errno)
			}
		case OpErrno:
			if r.Errno == 0 || r.Errno > maxErrno {
				return bad("errno %d is not in 1-%d", r.Errno, maxErrno)
			}
			if r.Index != 0 || r.Value != 0 {
				return bad("an errno rule checks no argument")
			}
		default:
			return bad("unknown op")
		}
		if prev, ok := ops[r.Name]; ok && (prev == OpErrno || r.Op == OpErrno) {
			return bad("an errno rule cannot be combined with other rules for the same syscall")
		}
		ops[r.Name] = r.Op
	}
	return nil
}
