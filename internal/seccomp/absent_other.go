//go:build !amd64

package seccomp

// nativeAbsent is unknown on this architecture: NativeNames keeps every
// name.
var nativeAbsent map[string]bool
