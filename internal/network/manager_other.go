//go:build !linux

package network

import (
	"context"
	"errors"
	"net/netip"
)

// Manager is only implemented on Linux.
type Manager struct{}

var errUnsupported = errors.New("sandbox networking needs Linux")

func New(ctx context.Context, cfg Config) (*Manager, error) { return nil, errUnsupported }

func (m *Manager) Start()                                {}
func (m *Manager) Close()                                {}
func (m *Manager) Gateway() netip.Addr                   { return netip.Addr{} }
func (m *Manager) Remove() error                         { return errUnsupported }
func (m *Manager) Stats(string) (Stats, error)           { return Stats{}, errUnsupported }
func (m *Manager) Counters(string) (int64, int64, error) { return 0, 0, errUnsupported }
func (m *Manager) Attach(context.Context, string, Policy) (Attachment, error) {
	return Attachment{}, errUnsupported
}
func (m *Manager) Update(context.Context, string, Policy) (Attachment, error) {
	return Attachment{}, errUnsupported
}
func (m *Manager) Recover(context.Context, string, []Secret) (Attachment, error) {
	return Attachment{}, errUnsupported
}
func (m *Manager) Placeholder(id, name string) string             { return "" }
func (m *Manager) CABundleDir() string                            { return "" }
func (m *Manager) Detach(context.Context, string) error           { return errUnsupported }
func (m *Manager) Cleanup(context.Context, map[string]bool) error { return errUnsupported }
