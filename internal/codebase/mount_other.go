//go:build !linux

package codebase

import (
	"context"
	"errors"
	"io"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/safepath"
)

var errNeedsLinux = errors.New("codebase mounts need Linux")

func mountLayer(string, string, int64, int) (*runtime.CodebaseMount, error) {
	return nil, errNeedsLinux
}
func unmountLayer(string) error    { return errNeedsLinux }
func removeUnmounted(string) error { return errNeedsLinux }

func (m *Manager) Sync(context.Context, string, string, bool, bool) (*sbxv1.SyncCodebaseResponse, error) {
	return nil, errNeedsLinux
}

func writeTar(context.Context, *safepath.Root, io.Writer, uint32, uint32) error { return errNeedsLinux }
