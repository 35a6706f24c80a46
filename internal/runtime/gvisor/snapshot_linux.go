//go:build linux

package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/ocibox"
)

var _ runtime.Snapshotter = (*Driver)(nil)

// Diff implements runtime.Snapshotter. runsc runs with --overlay2=none, so
// the box's writes land on the host in the overlay the driver mounted: its
// upper dir is the writable layer, as under oci, /tmp included (boxTmp).
// Boxes made before boxTmp have /tmp as a plain directory next to it on the
// same tmpfs (tmpDir): that is written into the layer as /tmp, opaque (it
// hid the image's /tmp in the box too).
// ocibox.WriteDiff treats both as hostile. The box is frozen (runsc pause)
// while the tar is written unless it already was (ocibox.Snapshot). gVisor's kernel writes
// write(2) data through to the host files of the root mount, so what a
// frozen box wrote is on the host (the suite's Snapshot checks a file a
// process still holds open); data written through a shared mmap and not
// yet msync'ed is not checked.
func (d *Driver) Diff(ctx context.Context, h runtime.Handle, w io.Writer, lim runtime.DiffLimits) error {
	if err := checkID(h.ID); err != nil {
		return err
	}
	box := d.boxDir(h.ID)
	st, err := d.state(ctx, h.ID)
	if err != nil {
		return fmt.Errorf("snapshot box %s: %w", h.ID, errors.Join(err, errdefs.ErrNotFound))
	}
	trees := []ocibox.DiffTree{{Dir: filepath.Join(rwDir(box), "upper")}}
	if _, err := os.Lstat(tmpDir(box)); err == nil {
		trees = append(trees, ocibox.DiffTree{Dir: tmpDir(box), At: "tmp", Plain: true})
	}
	return ocibox.Snapshot(ctx, w, h, st.Status == "running", d, lim, d.log, trees...)
}

// tmpDir is the /tmp of boxes made before boxTmp: a plain directory beside
// the writable layer, which Diff still reads.
func tmpDir(box string) string { return filepath.Join(box, "rw", "tmp") }
