//go:build !linux

package hostmount

import (
	"errors"
	"fmt"
)

// Mounting is Linux-only (the daemon that mounts runs only there); these
// keep `go build ./...` working elsewhere.

// Tmpfs fails: mounting needs Linux.
func Tmpfs(dir string, _ int64) error {
	return fmt.Errorf("mount tmpfs at %s: %w", dir, errors.ErrUnsupported)
}

// Unmount fails: mounting needs Linux.
func Unmount(dir string) error {
	return fmt.Errorf("unmount %s: %w", dir, errors.ErrUnsupported)
}
