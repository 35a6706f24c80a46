//go:build !linux

package oci

import (
	"context"
	"errors"
	"net"

	"github.com/sbxdev/sbx/internal/runtime"
)

var errUnsupported = errors.New("oci driver: only supported on Linux")

// Driver is a stub off Linux: New always fails.
type Driver struct{}

var _ runtime.Driver = (*Driver)(nil)

// New fails off Linux.
func New(cfg Config) (*Driver, error) { return nil, errUnsupported }

func (d *Driver) Name() string { return "oci" }
func (d *Driver) Info(context.Context) runtime.Info {
	return runtime.Info{Name: "oci", Detail: errUnsupported.Error()}
}
func (d *Driver) Create(context.Context, runtime.Spec) (runtime.Handle, error) {
	return runtime.Handle{}, errUnsupported
}
func (d *Driver) Recover(_ context.Context, h runtime.Handle) (runtime.Handle, error) {
	return h, errUnsupported
}
func (d *Driver) Pause(context.Context, runtime.Handle) error   { return errUnsupported }
func (d *Driver) Resume(context.Context, runtime.Handle) error  { return errUnsupported }
func (d *Driver) Destroy(context.Context, runtime.Handle) error { return errUnsupported }
func (d *Driver) Stats(context.Context, runtime.Handle) (runtime.Stats, error) {
	return runtime.Stats{}, errUnsupported
}
func (d *Driver) Dial(context.Context, runtime.Handle) (net.Conn, error) { return nil, errUnsupported }
func (d *Driver) Cleanup(context.Context, map[string]bool) error         { return errUnsupported }
func (d *Driver) Update(context.Context, runtime.Handle, runtime.Resources) error {
	return errUnsupported
}

// Close is a no-op off Linux.
func (d *Driver) Close() error { return nil }

// Leftovers lists nothing off Linux.
func Leftovers(Config, map[string]bool) ([]runtime.Leftover, error) { return nil, errUnsupported }
