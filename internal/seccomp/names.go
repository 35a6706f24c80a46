package seccomp

import (
	"errors"
	goruntime "runtime"
)

// ErrUnsupportedArch is returned by Compile on an architecture it has no
// syscall table for; callers fall back to their runtime's libseccomp.
var ErrUnsupportedArch = errors.New("seccomp: no syscall table for " + goruntime.GOARCH)

// NativeNames returns names without those that are known to have no
// syscall number on the native architecture (the runtime's libseccomp would
// skip them anyway; resolving them costs it time on every start). Unknown
// names and, on architectures without a table, all names are kept.
func NativeNames(names []string) []string {
	if nativeAbsent == nil {
		return names
	}
	out := make([]string, 0, len(names))
	for _, n := range names {
		if !nativeAbsent[n] {
			out = append(out, n)
		}
	}
	return out
}
