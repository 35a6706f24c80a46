//go:build linux

package oci

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/ocibox"
)

var _ runtime.Snapshotter = (*Driver)(nil)

// Diff implements runtime.Snapshotter: it writes the box's overlayfs upper
// dir as an OCI layer tar (ocibox.WriteDiff, which treats it as hostile),
// with the box frozen unless it already was (ocibox.Snapshot).
func (d *Driver) Diff(ctx context.Context, h runtime.Handle, w io.Writer, lim runtime.DiffLimits) error {
	if err := checkID(h.ID); err != nil {
		return err
	}
	upper := filepath.Join(rwDir(d.boxDir(h.ID)), "upper")
	st, err := d.rt.state(ctx, h.ID)
	if err != nil {
		return fmt.Errorf("snapshot box %s: %w", h.ID, err)
	}
	return ocibox.Snapshot(ctx, w, h, st.Status == "running", d, lim, d.log, ocibox.DiffTree{Dir: upper})
}
