//go:build !linux

package idmap

import (
	"errors"
	"os"
)

// ErrNotSupported is returned by Mount when the filesystem under src
// cannot be idmapped.
var ErrNotSupported = errors.New("idmapped mounts not supported by this filesystem")

var errNotLinux = errors.New("user namespaces and idmapped mounts need Linux")

// HelperArg is the first argument that runs Helper (see the Linux file).
const HelperArg = "sbx-box-userns-helper"

func BoxNamespace(r Range, exe, path string, lim Limits) (*os.File, error) { return nil, errNotLinux }
func Helper(args []string) error                                           { return errNotLinux }
func HostLimits() (Limits, error)                                          { return nil, errNotLinux }
func AsBox(r Range, f func() error) error                                  { return errNotLinux }
func Mount(src, dst string, userns *os.File, recursive bool) error         { return errNotLinux }
