//go:build linux

package gvisor

import (
	"errors"
	"fmt"

	"github.com/sbxdev/sbx/internal/seccomp"
)

// Who installs the box's seccomp profile (seccomp.Default) in gVisor's
// kernel. runsc's --oci-seccomp builds its filter from the spec but returns
// EPERM for every errno rule, whatever the rule's errnoRet: clone3 then
// fails with EPERM instead of ENOSYS, libc does not fall back to clone, and
// no thread starts in the box (every threaded program failed; conformance
// Isolation/CapabilitiesSeccompInBox checks it). So, like the oci driver,
// the agent installs the compiled profile itself (sbx-agent --seccomp),
// first thing, and gVisor's kernel applies it with each rule's own errno;
// only where the profile does not compile (no syscall table for the
// architecture) does runsc install it from the spec.

// agentSeccomp reports whether the agent can install the profile; an
// error is a profile the compiler refuses, which fails New rather than
// every create.
func agentSeccomp() (bool, error) {
	switch _, err := seccomp.Compile(seccomp.Default()); {
	case errors.Is(err, seccomp.ErrUnsupportedArch):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("gvisor: %w", err)
	}
	return true, nil
}
