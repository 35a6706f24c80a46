//go:build !linux

package agent

// boxFS resolves the file service's paths; it needs Linux (openat2).
type boxFS struct{}

func newBoxFS() (*boxFS, error) { return &boxFS{}, nil }

func (*boxFS) ensureDir(string, uint32) error { return errNotLinux }
