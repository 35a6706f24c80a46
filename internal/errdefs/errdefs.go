// Package errdefs owns sbx's sentinel errors. Every package wraps these with
// %w; only the server edge (internal/server) maps them to RPC codes. It
// imports nothing from sbx and anything may import it.
package errdefs

import "errors"

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
