// Package errdefs owns sbx's sentinel errors. Every package wraps these with
// %w; only the server edge (internal/server) maps them to RPC codes. It
// imports nothing from sbx and anything may import it.
package errdefs

import (
	"errors"
	"strings"
)

var (
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrDeadlineExceeded   = errors.New("deadline exceeded")
	ErrUnavailable        = errors.New("unavailable")
)

// Is* helpers read better at call sites than errors.Is(err, errdefs.ErrX).

func IsNotFound(err error) bool           { return errors.Is(err, ErrNotFound) }
func IsAlreadyExists(err error) bool      { return errors.Is(err, ErrAlreadyExists) }
func IsInvalidArgument(err error) bool    { return errors.Is(err, ErrInvalidArgument) }
func IsFailedPrecondition(err error) bool { return errors.Is(err, ErrFailedPrecondition) }

// CollapseRepeats drops a ": "-separated segment of msg that repeats the one
// before it: layers that each name what they were doing ("image "x": image
// "x": not found", "stat /p: stat /p: no such file") read once. The server
// edge applies it to every error it returns.
func CollapseRepeats(msg string) string {
	segs := strings.Split(msg, ": ")
	out := segs[:1]
	for _, s := range segs[1:] {
		if s == out[len(out)-1] {
			continue
		}
		out = append(out, s)
	}
	return strings.Join(out, ": ")
}
