//go:build linux && !amd64

package seccomp

// native is nil: no syscall table for this architecture yet, so Compile
// returns ErrUnsupportedArch (arm64 would need its own table of numbers and
// of absent names).
var native *archTable
