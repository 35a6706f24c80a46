//go:build linux

//sbx:hostile-tree

package ocibox

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/boxcopy"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/idmap"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/safepath"
)

// diffExcluded are paths (relative to the box root) of the writable layer
// that WriteDiff leaves out: files the drivers write into every box
// themselves, and the mount point of the agent binary. Everything under a
// listed directory is left out too.
var diffExcluded = map[string]bool{
	strings.TrimPrefix(path.Dir(AgentInBox), "/"): true,
	"etc/hostname": true,
	"etc/hosts":    true,
	// Written when the box has a network; an image's own stays in its layer.
	"etc/resolv.conf": true,
}

// diffEmptied are directories whose entry is kept but whose contents are
// not: API filesystems are mounted over them, so anything under them in the
// writable layer was put there before the mount and is invisible in the box.
var diffEmptied = map[string]bool{"proc": true, "sys": true, "dev": true}

// DiffTree is one host directory WriteDiff writes into the layer.
type DiffTree struct {
	// Dir is the directory on the host. The path up to it is the driver's
	// own; only what is below it is the box's.
	Dir string
	// At is where the box sees it, relative to its root ("" for the
	// writable layer's upper dir itself).
	At string
	// Plain says Dir is an ordinary directory mounted over At (the gvisor
	// driver's /tmp), not an overlayfs upper dir: it has no whiteouts or
	// overlay attributes, and hides what the layers below hold at At, so
	// the layer marks At opaque; the upper dir's own entries at and below
	// At are left out.
	Plain bool
}

// DiffStats is what WriteDiff wrote, for the driver's log.
type DiffStats struct {
	DataBytes, ApparentBytes int64
	// Skipped are entries left out (sockets, FIFOs, devices, literal .wh.
	// names); Sparse the files written as sparse entries.
	Skipped, Sparse int
}

// WriteDiff writes a box's writable layer as an OCI layer tar
// (runtime.Snapshotter): trees in order, the overlayfs upper dir first.
// Each is written by the box, so it is walked through internal/safepath:
// no symlink in any component is ever followed, and a symlink is captured
// as a symlink. Files with holes become GNU sparse entries (see
// sparsetar.go): their holes are neither read nor written, and only their
// data counts against lim.DataBytes. id names the box in errors. The
// caller freezes the box around it.
func WriteDiff(ctx context.Context, w io.Writer, id string, lim runtime.DiffLimits, trees ...DiffTree) (DiffStats, error) {
	dw := newDiffWriter(ctx, nil, w, id, lim)
	for _, t := range trees {
		if t.Plain {
			dw.mounted[t.At] = true
		}
	}
	for _, t := range trees {
		root, err := safepath.OpenRoot(t.Dir)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return DiffStats{}, fmt.Errorf("no writable layer: %w", errdefs.ErrNotFound)
			}
			return DiffStats{}, fmt.Errorf("open writable layer: %w", err)
		}
		dw.root, dw.at, dw.plain = root, t.At, t.Plain
		if t.Plain {
			err = dw.plainDir(t.Dir)
		}
		if err == nil {
			err = root.Walk(".", dw.visit)
		}
		root.Close()
		if err != nil {
			return DiffStats{}, err
		}
	}
	if err := dw.tw.Close(); err != nil {
		return DiffStats{}, err
	}
	return DiffStats{DataBytes: dw.data.Used(), ApparentBytes: dw.apparent.Used(), Skipped: dw.skipped, Sparse: dw.sparse}, nil
}

type fileID struct{ dev, ino uint64 }

// diffWriter turns the trees of a writable layer into tar entries.
type diffWriter struct {
	ctx context.Context
	// root is the tree being walked, at where the box sees it, plain
	// whether it is an ordinary directory (DiffTree).
	root  *safepath.Root
	at    string
	plain bool
	// mounted are the At of plain trees: the upper dir's entries there
	// are hidden by the mount.
	mounted map[string]bool
	w       io.Writer // under tw, for the sparse entries' own PAX headers
	tw      *tar.Writer
	// data counts file data (holes left out) against the box's disk
	// limit, apparent the layer's size as extracted (holes included).
	data, apparent *boxcopy.Budget
	links          map[fileID]string // first name of each multiply-linked file
	buf            []byte
	skipped        int
	sparse         int
}

func newDiffWriter(ctx context.Context, root *safepath.Root, w io.Writer, id string, lim runtime.DiffLimits) *diffWriter {
	dw := &diffWriter{ctx: ctx, root: root, w: w, tw: tar.NewWriter(w), links: map[fileID]string{}, buf: make([]byte, 1<<20),
		mounted: map[string]bool{}}
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

// visit is the safepath.WalkFunc writing each entry. rel is the entry's
// path in dw.root, full its path in the box (and the layer).
func (dw *diffWriter) visit(rel string, e safepath.Entry) error {
	if err := dw.ctx.Err(); err != nil {
		return err
	}
	full := rel
	if dw.at != "" {
		full = path.Join(dw.at, rel)
	}
	isDir := e.IsDir()
	if diffExcluded[full] || !dw.plain && dw.mounted[full] {
		if isDir {
			return fs.SkipDir
		}
		return nil
	}
	st := e.Stat()
	if err := dw.apparent.Take(headerCost + int64(len(full))); err != nil {
		return err
	}
	name := path.Base(full)
	hdr := &tar.Header{
		Name:    full,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     boxID(st.Uid),
		Gid:     boxID(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix()),
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		if st.Rdev != 0 || dw.plain {
			dw.skipped++
			return nil
		}
		// An overlayfs whiteout: the lower file was deleted.
		return dw.tw.WriteHeader(&tar.Header{Name: path.Join(path.Dir(full), ".wh."+name), Typeflag: tar.TypeReg,
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
		return dw.dir(rel, full, hdr)
	case unix.S_IFREG:
		if strings.HasPrefix(name, ".wh.") {
			dw.skipped++ // cannot be told apart from a whiteout in a layer
			return nil
		}
		return dw.file(rel, full, hdr, st)
	}
	dw.skipped++ // sockets, FIFOs, device nodes
	return nil
}

func (dw *diffWriter) dir(rel, full string, hdr *tar.Header) error {
	for _, attr := range []string{"trusted.overlay.redirect", "user.overlay.redirect"} {
		if dw.plain {
			break
		}
		if _, ok, err := dw.root.Getxattr(rel, attr); err != nil {
			return fmt.Errorf("read attributes of %s: %w", displayName(full), err)
		} else if ok {
			return fmt.Errorf("%s is a renamed lower directory (overlayfs redirect_dir): not supported: %w",
				displayName(full), errdefs.ErrFailedPrecondition)
		}
	}
	hdr.Typeflag, hdr.Name = tar.TypeDir, full+"/"
	if err := dw.tw.WriteHeader(hdr); err != nil {
		return err
	}
	// A plain tree hides what the layers below hold where it is mounted.
	opaque := dw.plain && rel == "."
	if !dw.plain {
		var err error
		if opaque, err = dw.opaque(rel); err != nil {
			return err
		}
	}
	if opaque {
		if err := dw.tw.WriteHeader(&tar.Header{Name: full + "/.wh..wh..opq", Typeflag: tar.TypeReg,
			Mode: 0o600, ModTime: hdr.ModTime}); err != nil {
			return err
		}
	}
	if diffEmptied[full] {
		return fs.SkipDir
	}
	return nil
}

// plainDir writes the entry of a plain tree's own directory (Walk visits
// only what is below it), opaque: it hides the layers' dw.at.
func (dw *diffWriter) plainDir(dir string) error {
	var st unix.Stat_t
	// safepath:ok: dir is the driver's own (the mount's source), not the box's.
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("stat %s: %w", displayName(dw.at), err)
	}
	if err := dw.apparent.Take(headerCost + int64(len(dw.at))); err != nil {
		return err
	}
	return dw.dir(".", dw.at, &tar.Header{Mode: int64(st.Mode & 0o7777), Uid: boxID(st.Uid), Gid: boxID(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix())})
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

func (dw *diffWriter) file(rel, full string, hdr *tar.Header, st *unix.Stat_t) error {
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
	if !dw.plain && (hasXattr(fd, "trusted.overlay.metacopy") || hasXattr(fd, "user.overlay.metacopy")) {
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
		dw.links[id] = full
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
