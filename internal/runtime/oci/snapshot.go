//go:build linux

package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"

	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/ocibox"
)

var _ runtime.Snapshotter = (*Driver)(nil)

// Diff implements runtime.Snapshotter: it writes the box's overlayfs upper
// dir as an OCI layer tar (ocibox.WriteDiff, which treats it as hostile),
// with the box frozen unless it already was.
func (d *Driver) Diff(ctx context.Context, h runtime.Handle, w io.Writer, lim runtime.DiffLimits) (err error) {
	if err := checkID(h.ID); err != nil {
		return err
	}
	upper := filepath.Join(rwDir(d.boxDir(h.ID)), "upper")
	st, err := d.rt.state(ctx, h.ID)
	if err != nil {
		return fmt.Errorf("snapshot box %s: %w", h.ID, err)
	}
	if st.Status == "running" {
		if err := d.Pause(ctx, h); err != nil {
			return fmt.Errorf("snapshot box %s: freeze: %w", h.ID, err)
		}
		defer func() {
			if rerr := d.Resume(context.WithoutCancel(ctx), h); rerr != nil {
				err = errors.Join(err, fmt.Errorf("snapshot box %s: thaw: %w", h.ID, rerr))
			}
		}()
	}
	stats, err := ocibox.WriteDiff(ctx, w, h.ID, lim, ocibox.DiffTree{Dir: upper})
	if err != nil {
		return fmt.Errorf("snapshot box %s: %w", h.ID, err)
	}
	if stats.Skipped > 0 {
		d.log.Debug("snapshot: entries left out (sockets, FIFOs, devices, literal .wh. names)", "id", h.ID, "count", stats.Skipped)
	}
	d.log.Debug("snapshot written", "id", h.ID, "data_bytes", stats.DataBytes, "apparent_bytes", stats.ApparentBytes,
		"sparse_files", stats.Sparse)
	return nil
}
