//go:build linux

package ocibox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/sbxdev/sbx/internal/runtime"
)

// Freezer freezes and thaws a box: a driver's Pause and Resume.
type Freezer interface {
	Pause(ctx context.Context, h runtime.Handle) error
	Resume(ctx context.Context, h runtime.Handle) error
}

// Snapshot is both drivers' runtime.Snapshotter.Diff around WriteDiff: it
// freezes box h with f while it writes trees to w if the box is running
// (running: the runtime's state), thaws it after, and logs what was
// written and what was left out.
func Snapshot(ctx context.Context, w io.Writer, h runtime.Handle, running bool, f Freezer, lim runtime.DiffLimits, log *slog.Logger, trees ...DiffTree) (err error) {
	if running {
		if err := f.Pause(ctx, h); err != nil {
			return fmt.Errorf("snapshot box %s: freeze: %w", h.ID, err)
		}
		defer func() {
			if rerr := f.Resume(context.WithoutCancel(ctx), h); rerr != nil {
				err = errors.Join(err, fmt.Errorf("snapshot box %s: thaw: %w", h.ID, rerr))
			}
		}()
	}
	stats, err := WriteDiff(ctx, w, h.ID, lim, trees...)
	if err != nil {
		return fmt.Errorf("snapshot box %s: %w", h.ID, err)
	}
	log.Debug("snapshot written", "id", h.ID, "data_bytes", stats.DataBytes, "apparent_bytes", stats.ApparentBytes,
		"sparse_files", stats.Sparse, "left_out", stats.Skipped)
	return nil
}
