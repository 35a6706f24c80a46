//go:build !linux

package pidwatch

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"
)

func signalName(syscall.Signal) string { return "" }

// StartTime is 0 off Linux: no process can be identified.
func StartTime(int) uint64 { return 0 }

// GoneOrZombie reports true off Linux.
func GoneOrZombie(int) bool { return true }

// Watch is unsupported off Linux.
func Watch[T any](_ context.Context, pid int, _ uint64, _ func(Status) T) (<-chan T, error) {
	return nil, fmt.Errorf("watch pid %d: %w", pid, errors.ErrUnsupported)
}

// Kill is unsupported off Linux.
func Kill(pid int, _ uint64) error {
	return fmt.Errorf("kill pid %d: %w", pid, errors.ErrUnsupported)
}

// Reap does nothing off Linux.
func Reap(int, time.Duration) error { return nil }

// ReapIfOurs does nothing off Linux.
func ReapIfOurs(int, uint64, time.Duration) error { return nil }

// ChildrenOf finds none off Linux.
func ChildrenOf([]int) map[int]uint64 { return nil }
