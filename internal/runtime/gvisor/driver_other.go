//go:build !linux

package gvisor

import (
	"context"
	"errors"
	"net"

	"github.com/sbxdev/sbx/internal/runtime"
)

// errUnsupported is returned by New off Linux.
var errUnsupported = errors.New("gvisor: only on linux")

// Driver is the gvisor driver; off Linux it cannot be made.
type Driver struct{}

var _ runtime.Driver = (*Driver)(nil)

// New fails off Linux.
func New(Config) (*Driver, error) { return nil, errUnsupported }

func (*Driver) Name() string { return name }
func (*Driver) Info(context.Context) runtime.Info {
	return runtime.Info{Name: name, Detail: errUnsupported.Error()}
}
func (*Driver) Close() error { return nil }
func (*Driver) Create(context.Context, runtime.Spec) (runtime.Handle, error) {
	return runtime.Handle{}, errUnsupported
}
func (*Driver) Recover(_ context.Context, h runtime.Handle) (runtime.Handle, error) {
	return h, errUnsupported
}
func (*Driver) Pause(context.Context, runtime.Handle) error   { return errUnsupported }
func (*Driver) Resume(context.Context, runtime.Handle) error  { return errUnsupported }
func (*Driver) Destroy(context.Context, runtime.Handle) error { return errUnsupported }
func (*Driver) Stats(context.Context, runtime.Handle) (runtime.Stats, error) {
	return runtime.Stats{}, errUnsupported
}
func (*Driver) Dial(context.Context, runtime.Handle) (net.Conn, error) { return nil, errUnsupported }
func (*Driver) Cleanup(context.Context, map[string]bool) error         { return errUnsupported }

// Leftovers lists nothing off Linux.
func Leftovers(Config, map[string]bool) ([]runtime.Leftover, error) { return nil, errUnsupported }
