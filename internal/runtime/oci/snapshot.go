//go:build linux

//sbx:hostile-tree

package oci

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/boxcopy"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/idmap"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/safepath"
)

var _ runtime.Snapshotter = (*Driver)(nil)

// diffExcluded are paths (relative to the box root) of the writable layer
// that Diff leaves out: files the driver writes into every box itself, and
// the mount point of the agent binary. Everything under a listed directory
// is left out too.
var diffExcluded = map[string]bool{
	strings.TrimPrefix(path.Dir(agentInBox), "/"): true,
	"etc/hostname": true,
	"etc/hosts":    true,
	// Written when the box has a network; an image's own stays in its layer.
	"etc/resolv.conf": true,
}

// diffEmptied are directories whose entry is kept but whose contents are
// not: API filesystems are mounted over them, so anything under them in the
// writable layer was put there before the mount and is invisible in the box.
var diffEmptied = map[string]bool{"proc": true, "sys": true, "dev": true}

// Diff implements runtime.Snapshotter: it writes the box's overlayfs upper
// dir as an OCI layer tar. The upper dir is written by the box, so it is
// walked through internal/safepath: no symlink in any component is ever
// followed, and a symlink is captured as a symlink. Files with holes become
// GNU sparse entries (see sparsetar.go): their holes are neither read nor
// written, and only their data counts against lim.DataBytes.
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
	// The path up to upper is the driver's own; only what is below it is
	// the box's.
	root, err := safepath.OpenRoot(upper)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("snapshot box %s: no writable layer: %w", h.ID, errdefs.ErrNotFound)
		}
		return fmt.Errorf("snapshot box %s: open writable layer: %w", h.ID, err)
	}
	defer root.Close()
	dw := newDiffWriter(ctx, root, w, h.ID, lim)
	if err := root.Walk(".", dw.visit); err != nil {
		return fmt.Errorf("snapshot box %s: %w", h.ID, err)
	}
	if err := dw.tw.Close(); err != nil {
		return fmt.Errorf("snapshot box %s: %w", h.ID, err)
	}
	if dw.skipped > 0 {
		d.log.Debug("snapshot: entries left out (sockets, FIFOs, devices, literal .wh. names)", "id", h.ID, "count", dw.skipped)
	}
	d.log.Debug("snapshot written", "id", h.ID, "data_bytes", dw.data.Used(), "apparent_bytes", dw.apparent.Used(),
		"sparse_files", dw.sparse)
	return nil
}

type fileID struct{ dev, ino uint64 }

// diffWriter turns one upper dir into tar entries.
type diffWriter struct {
	ctx  context.Context
	root *safepath.Root
	w    io.Writer // under tw, for the sparse entries' own PAX headers
	tw   *tar.Writer
	// data counts file data (holes left out) against the box's disk
	// limit, apparent the layer's size as extracted (holes included).
	data, apparent *boxcopy.Budget
	links          map[fileID]string // first name of each multiply-linked file
	buf            []byte
	skipped        int
	sparse         int
}

func newDiffWriter(ctx context.Context, root *safepath.Root, w io.Writer, id string, lim runtime.DiffLimits) *diffWriter {
	dw := &diffWriter{ctx: ctx, root: root, w: w, tw: tar.NewWriter(w), links: map[fileID]string{}, buf: make([]byte, 1<<20)}
	if lim.DataBytes > 0 {
		what := lim.DataWhat
		if what == "" {
			what = "box " + id + "'s disk limit"
		}
		dw.data = boxcopy.NewBudget(lim.DataBytes, what)
	}
	if lim.ApparentBytes > 0 {
		what := lim.ApparentWhat
		if what == "" {
			what = "the largest layer allowed"
		}
		dw.apparent = boxcopy.NewBudget(lim.ApparentBytes, what)
	}
	return dw
}

// headerCost is what one entry's headers are counted as against the
// apparent budget (a ustar block, with room for a PAX header).
const headerCost = 3 * blockSize

// visit is the safepath.WalkFunc writing each entry.
func (dw *diffWriter) visit(rel string, e safepath.Entry) error {
	if err := dw.ctx.Err(); err != nil {
		return err
	}
	isDir := e.IsDir()
	if diffExcluded[rel] {
		if isDir {
			return fs.SkipDir
		}
		return nil
	}
	st := e.Stat()
	if err := dw.apparent.Take(headerCost + int64(len(rel))); err != nil {
		return err
	}
	name := path.Base(rel)
	hdr := &tar.Header{
		Name:    rel,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     boxID(st.Uid),
		Gid:     boxID(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix()),
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		if st.Rdev != 0 {
			dw.skipped++
			return nil
		}
		// An overlayfs whiteout: the lower file was deleted.
		return dw.tw.WriteHeader(&tar.Header{Name: path.Join(path.Dir(rel), ".wh."+name), Typeflag: tar.TypeReg,
			Mode: 0o600, ModTime: hdr.ModTime})
	case unix.S_IFLNK:
		target, err := dw.root.Readlink(rel)
		if err != nil {
			return fmt.Errorf("read link %s: %w", displayName(rel), err)
		}
		if len(target) > 1<<16 {
			return fmt.Errorf("symlink %s: target too long", displayName(rel))
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		return dw.tw.WriteHeader(hdr)
	case unix.S_IFDIR:
		return dw.dir(rel, hdr)
	case unix.S_IFREG:
		if strings.HasPrefix(name, ".wh.") {
			dw.skipped++ // cannot be told apart from a whiteout in a layer
			return nil
		}
		return dw.file(rel, hdr, st)
	}
	dw.skipped++ // sockets, FIFOs, device nodes
	return nil
}

func (dw *diffWriter) dir(rel string, hdr *tar.Header) error {
	for _, attr := range []string{"trusted.overlay.redirect", "user.overlay.redirect"} {
		if _, ok, err := dw.root.Getxattr(rel, attr); err != nil {
			return fmt.Errorf("read attributes of %s: %w", displayName(rel), err)
		} else if ok {
			return fmt.Errorf("%s is a renamed lower directory (overlayfs redirect_dir): not supported: %w",
				displayName(rel), errdefs.ErrFailedPrecondition)
		}
	}
	hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
	if err := dw.tw.WriteHeader(hdr); err != nil {
		return err
	}
	opaque, err := dw.opaque(rel)
	if err != nil {
		return err
	}
	if opaque {
		if err := dw.tw.WriteHeader(&tar.Header{Name: rel + "/.wh..wh..opq", Typeflag: tar.TypeReg,
			Mode: 0o600, ModTime: hdr.ModTime}); err != nil {
			return err
		}
	}
	if diffEmptied[rel] {
		return fs.SkipDir
	}
	return nil
}

// opaque reports whether the directory rel hides the lower directories of
// the same name.
func (dw *diffWriter) opaque(rel string) (bool, error) {
	for _, attr := range []string{"trusted.overlay.opaque", "user.overlay.opaque"} {
		v, ok, err := dw.root.Getxattr(rel, attr)
		if err != nil {
			return false, fmt.Errorf("read attributes of %s: %w", displayName(rel), err)
		}
		if ok && string(v) == "y" {
			return true, nil
		}
	}
	return false, nil
}

func (dw *diffWriter) file(rel string, hdr *tar.Header, st *unix.Stat_t) error {
	id := fileID{dev: st.Dev, ino: st.Ino}
	if st.Nlink > 1 {
		if first, ok := dw.links[id]; ok {
			hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
			return dw.tw.WriteHeader(hdr)
		}
	}
	// O_NONBLOCK: a FIFO swapped in since the listing must not hang us.
	f, err := dw.root.OpenFile(rel, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", displayName(rel), err)
	}
	defer f.Close()
	fd := int(f.Fd())
	var fst unix.Stat_t
	if err := unix.Fstat(fd, &fst); err != nil {
		return fmt.Errorf("stat %s: %w", displayName(rel), err)
	}
	if fst.Ino != st.Ino || fst.Dev != st.Dev || fst.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%s changed while being read", displayName(rel))
	}
	if hasXattr(fd, "trusted.overlay.metacopy") || hasXattr(fd, "user.overlay.metacopy") {
		return fmt.Errorf("%s holds metadata only (overlayfs metacopy): not supported: %w",
			displayName(rel), errdefs.ErrFailedPrecondition)
	}
	hdr.Typeflag, hdr.Size = tar.TypeReg, fst.Size
	if err := dw.apparent.Take(fst.Size); err != nil {
		return err
	}
	frags, data, err := dataFragments(f, fst.Size)
	if err != nil {
		return fmt.Errorf("read %s: %w", displayName(rel), err)
	}
	if err := dw.data.Take(data); err != nil {
		return err
	}
	var mapBlock []byte
	if len(frags) == 1 && frags[0].off == 0 && frags[0].n == fst.Size || fst.Size == 0 {
		if err := dw.tw.WriteHeader(hdr); err != nil {
			return err
		}
	} else {
		if len(frags) == 0 {
			frags = []fragment{{off: fst.Size, n: 0}} // all hole
		}
		if mapBlock, err = writeSparseHeader(dw.tw, dw.w, hdr, frags); err != nil {
			return err
		}
		if _, err := dw.tw.Write(mapBlock); err != nil {
			return err
		}
		dw.sparse++
	}
	for _, fr := range frags {
		if err := dw.copyRange(f, rel, fr); err != nil {
			return err
		}
	}
	if st.Nlink > 1 {
		dw.links[id] = rel
	}
	return nil
}

// copyRange writes the bytes [fr.off, fr.off+fr.n) of f to the tar.
func (dw *diffWriter) copyRange(f *os.File, rel string, fr fragment) error {
	for pos, end := fr.off, fr.off+fr.n; pos < end; {
		if err := dw.ctx.Err(); err != nil {
			return err
		}
		b := dw.buf[:min(int64(len(dw.buf)), end-pos)]
		n, err := f.ReadAt(b, pos)
		if n < len(b) {
			if err == nil || errors.Is(err, io.EOF) {
				return fmt.Errorf("%s shrank while being read", displayName(rel))
			}
			return fmt.Errorf("read %s: %w", displayName(rel), err)
		}
		if _, err := dw.tw.Write(b); err != nil {
			return err
		}
		pos += int64(n)
	}
	return nil
}

// dataFragments lists the data segments of f (size bytes): its holes are
// what lies between them. data is the bytes they hold. A file with more
// than maxFragments segments has its shortest holes merged into data (as
// zeros), so that its sparse map stays readable; data counts only real
// data, and the merged zeros are within the file's apparent size.
func dataFragments(f *os.File, size int64) (frags []fragment, data int64, err error) {
	for off := int64(0); off < size; {
		start, end, err := boxcopy.NextData(f, off, size)
		if err != nil {
			return nil, 0, err
		}
		if start >= size {
			break
		}
		frags = append(frags, fragment{off: start, n: end - start})
		data += end - start
		off = end
		if len(frags) > maxFragments {
			frags = shrinkFragments(frags, maxFragments*3/4)
		}
	}
	return frags, data, nil
}

// boxID maps a host uid or gid back to the box's view: the mapped range
// shifts down, anything else shows up as nobody (as it does in the box).
func boxID(id uint32) int {
	if idmap.Canonical.Contains(id) {
		return int(id - idmap.Canonical.Base)
	}
	return 65534
}

func hasXattr(fd int, attr string) bool {
	n, err := unix.Fgetxattr(fd, attr, nil)
	return err == nil && n >= 0
}

// displayName keeps names chosen inside the box short in error messages.
func displayName(rel string) string {
	rel = "/" + rel
	if len(rel) > 200 {
		return fmt.Sprintf("%q...", rel[:200])
	}
	return fmt.Sprintf("%q", rel)
}
