package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/sbxdev/sbx/internal/boxcopy"
	"github.com/sbxdev/sbx/internal/errdefs"
)

// Layer tarballs come from whoever built or served the image: every entry is
// hostile. The extractor below turns one uncompressed layer tar into a
// directory usable as an overlayfs lower layer, under these rules:
//
//   - Names are resolved lexically relative to the layer root: "./", "/" and
//     repeated slashes are dropped ("/etc/x" lands at <layer>/etc/x) and ".."
//     removes the previous component. A name (or hardlink target) whose ".."
//     would climb above the root rejects the whole layer with an error naming
//     the entry. Names longer than maxNameLen are rejected too.
//   - Every filesystem call goes through an os.Root opened on the layer dir,
//     so a symlink planted by an earlier entry (relative or absolute, e.g.
//     etc -> /etc) can never redirect a later write outside the layer: such a
//     write fails and rejects the layer. Regular files are created with
//     O_EXCL after removing whatever had the name, so the last component is
//     never followed either. Symlinks are created verbatim.
//   - Hardlinks may only point at an existing non-directory of the same layer.
//   - Character and block devices and FIFOs are skipped (a box cannot use
//     image-provided device nodes; /dev is a tmpfs). Unknown entry types and
//     xattrs (PAX SCHILY.xattr.*, which could carry trusted.overlay.* or file
//     capabilities) are ignored.
//   - Files lose setuid, setgid and sticky bits; directories keep sticky and
//     setgid (/tmp) and lose setuid.
//   - Whiteouts: ".wh.NAME" becomes an overlayfs whiteout (char device 0:0)
//     named NAME; ".wh..wh..opq" marks its directory opaque
//     (trusted.overlay.opaque=y); other ".wh..wh." entries are ignored.
//   - Ownership: a tar uid/gid u < IDRange becomes UIDShift+u; anything else
//     (or negative) becomes the overflow id UIDShift+65534.
//   - Budgets: at most maxBytes of file contents (apparent sizes: a sparse
//     entry's holes count) and maxEntries entries.
//   - Holes: aligned 4 KiB blocks of zeros (a sparse entry's holes, or
//     zeros written out) are not written, so they stay holes on the host.
//
// The caller extracts into a fresh private directory and only moves it into
// place once the stream's digests are verified, so a rejected layer leaves
// nothing behind.

const (
	// maxNameLen bounds entry names and link targets (PATH_MAX). Longer names
	// would make every os.Root walk arbitrarily expensive.
	maxNameLen = 4096
	// defaultMaxEntries bounds the number of entries in one layer.
	defaultMaxEntries = 1_000_000
	// overflowID is the id (inside the sandbox) that unmappable ids become.
	overflowID = 65534
	// copyBufSize is the buffer used to copy file contents.
	copyBufSize = 1 << 20
)

// errLayerRejected is wrapped by every error caused by the layer's content
// (as opposed to I/O failures of the store itself).
var errLayerRejected = fmt.Errorf("layer rejected: %w", errdefs.ErrInvalidArgument)

// extractOptions configures one extraction.
type extractOptions struct {
	UIDShift   uint32
	IDRange    uint32
	MaxBytes   int64
	MaxEntries int
	Logger     *slog.Logger
}

// extractStats reports what an extraction did.
type extractStats struct {
	Entries     int
	Bytes       int64 // file contents read (apparent sizes, holes included)
	Written     int64 // file data written (blocks of zeros are left as holes)
	Skipped     int   // devices, FIFOs, unknown types
	OverflowIDs int   // entries whose uid or gid was mapped to the overflow id
	Stripped    int   // files that lost setuid/setgid/sticky bits
}

// extractor holds the state of one extraction.
type extractor struct {
	ctx  context.Context
	root *os.Root
	opt  extractOptions
	st   extractStats
	buf  []byte
	// dirs known to exist as real directories (cleared when anything is
	// removed, since a removal may invalidate entries).
	dirs map[string]bool
	// dirTimes are applied last, deepest first, since creating entries
	// changes the mtime of their parent.
	dirTimes []dirTime
}

type dirTime struct {
	name         string
	atime, mtime time.Time
}

// extractLayer unpacks the uncompressed tar stream r into dir, which must be
// an empty directory private to the caller. It reads r only up to the end of
// the archive; the caller drains the rest (for hashing).
func extractLayer(ctx context.Context, r io.Reader, dir string, opt extractOptions) (extractStats, error) {
	if opt.IDRange == 0 {
		opt.IDRange = 65536
	}
	if opt.MaxEntries == 0 {
		opt.MaxEntries = defaultMaxEntries
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return extractStats{}, fmt.Errorf("open layer dir: %w", err)
	}
	defer root.Close()
	e := &extractor{ctx: ctx, root: root, opt: opt, buf: make([]byte, copyBufSize), dirs: map[string]bool{".": true}}
	// The root belongs to sandbox root unless the tar says otherwise ("./").
	if err := root.Lchown(".", e.mapID(0), e.mapID(0)); err != nil {
		return e.st, fmt.Errorf("chown layer root: %w", err)
	}
	if err := root.Chmod(".", 0o755); err != nil {
		return e.st, fmt.Errorf("chmod layer root: %w", err)
	}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if errors.Is(err, tar.ErrHeader) {
				err = fmt.Errorf("%w: %w", err, errLayerRejected) // malformed: the layer's doing
			}
			return e.st, fmt.Errorf("read tar header after %d entries: %w", e.st.Entries, err)
		}
		if err := ctx.Err(); err != nil {
			return e.st, err
		}
		e.st.Entries++
		if e.st.Entries > opt.MaxEntries {
			return e.st, fmt.Errorf("more than %d entries: %w", opt.MaxEntries, errLayerRejected)
		}
		if err := e.entry(hdr, tr); err != nil {
			return e.st, fmt.Errorf("entry %q: %w", shorten(hdr.Name), classify(ctx, err))
		}
	}
	for i := len(e.dirTimes) - 1; i >= 0; i-- {
		d := e.dirTimes[i]
		if fi, err := root.Lstat(d.name); err != nil || !fi.IsDir() {
			continue // replaced by a later entry
		}
		if err := root.Chtimes(d.name, d.atime, d.mtime); err != nil {
			return e.st, fmt.Errorf("set times of %q: %w", d.name, err)
		}
	}
	if e.st.OverflowIDs > 0 {
		opt.Logger.Info("layer has uids/gids outside the mapped range; mapped to the overflow id",
			"entries", e.st.OverflowIDs, "overflow", opt.UIDShift+e.overflow())
	}
	if e.st.Skipped > 0 {
		opt.Logger.Debug("layer entries skipped (devices, FIFOs, unknown types)", "count", e.st.Skipped)
	}
	return e.st, nil
}

// cleanName resolves a tar name lexically inside the layer root. It returns
// "." for the root itself.
func cleanName(name string) (string, error) {
	if len(name) > maxNameLen {
		return "", fmt.Errorf("name longer than %d bytes: %w", maxNameLen, errLayerRejected)
	}
	if strings.IndexByte(name, 0) >= 0 {
		return "", fmt.Errorf("name contains NUL: %w", errLayerRejected)
	}
	parts := make([]string, 0, 8)
	for c := range strings.SplitSeq(name, "/") {
		switch c {
		case "", ".":
		case "..":
			if len(parts) == 0 {
				return "", fmt.Errorf("path escapes the layer root: %w", errLayerRejected)
			}
			parts = parts[:len(parts)-1]
		default:
			parts = append(parts, c)
		}
	}
	if len(parts) == 0 {
		return ".", nil
	}
	return strings.Join(parts, "/"), nil
}

func (e *extractor) overflow() uint32 {
	if e.opt.IDRange <= overflowID {
		return e.opt.IDRange - 1
	}
	return overflowID
}

// mapID shifts a tar uid/gid into the sandbox's host range.
func (e *extractor) mapID(id int) int {
	if id >= 0 && int64(id) < int64(e.opt.IDRange) {
		return int(e.opt.UIDShift) + id
	}
	return int(e.opt.UIDShift + e.overflow())
}

func (e *extractor) owner(hdr *tar.Header) (uid, gid int) {
	uid, gid = e.mapID(hdr.Uid), e.mapID(hdr.Gid)
	if uid != int(e.opt.UIDShift)+hdr.Uid || gid != int(e.opt.UIDShift)+hdr.Gid {
		e.st.OverflowIDs++
	}
	return uid, gid
}

func (e *extractor) entry(hdr *tar.Header, tr *tar.Reader) error {
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if base := path.Base(name); strings.HasPrefix(base, ".wh.") {
		return e.whiteout(path.Dir(name), base)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return e.dir(name, hdr)
	case tar.TypeReg, tar.TypeGNUSparse:
		return e.file(name, hdr, tr)
	case tar.TypeSymlink:
		return e.symlink(name, hdr)
	case tar.TypeLink:
		return e.hardlink(name, hdr)
	case tar.TypeXGlobalHeader:
		e.st.Entries-- // not a file; archive/tar already applied it
		return nil
	default: // devices, FIFOs, volume labels, ...
		e.st.Skipped++
		return nil
	}
}

// ensureParents creates the missing parent directories of name, owned by
// sandbox root with mode 0755 (as tar extractors do).
func (e *extractor) ensureParents(name string) error {
	dir := path.Dir(name)
	if e.dirs[dir] {
		return nil
	}
	var p string
	for c := range strings.SplitSeq(dir, "/") {
		if p == "" {
			p = c
		} else {
			p += "/" + c
		}
		if e.dirs[p] {
			continue
		}
		fi, err := e.root.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := e.root.Mkdir(p, 0o755); err != nil {
				return err
			}
			if err := e.root.Lchown(p, e.mapID(0), e.mapID(0)); err != nil {
				return err
			}
		case err != nil:
			return err
		case fi.Mode()&fs.ModeSymlink != 0:
			// Followed by os.Root, which refuses targets outside the layer.
			continue
		case !fi.IsDir():
			return fmt.Errorf("parent %q is not a directory: %w", p, errLayerRejected)
		}
		e.dirs[p] = true
	}
	return nil
}

// clear removes whatever exists at name so a new entry can take its place.
// keepDir leaves an existing real directory alone (a directory entry for an
// existing directory only updates its metadata, as tar does).
func (e *extractor) clear(name string, keepDir bool) (exists bool, err error) {
	fi, err := e.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if fi.IsDir() {
		if keepDir {
			return true, nil
		}
		if name == "." {
			return false, fmt.Errorf("cannot replace the layer root: %w", errLayerRejected)
		}
		clear(e.dirs)
		e.dirs["."] = true
		return false, e.root.RemoveAll(name)
	}
	return false, e.root.Remove(name)
}

func (e *extractor) dir(name string, hdr *tar.Header) error {
	if err := e.ensureParents(name); err != nil {
		return err
	}
	exists, err := e.clear(name, true)
	if err != nil {
		return err
	}
	if !exists {
		if err := e.root.Mkdir(name, 0o755); err != nil {
			return err
		}
	}
	e.dirs[name] = true
	uid, gid := e.owner(hdr)
	if err := e.root.Lchown(name, uid, gid); err != nil {
		return err
	}
	mode := hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSticky | fs.ModeSetgid)
	if err := e.root.Chmod(name, mode); err != nil {
		return err
	}
	e.dirTimes = append(e.dirTimes, dirTime{name, atimeOf(hdr), hdr.ModTime})
	return nil
}

func (e *extractor) file(name string, hdr *tar.Header, tr io.Reader) error {
	if name == "." {
		return fmt.Errorf("regular file named like the layer root: %w", errLayerRejected)
	}
	if err := e.ensureParents(name); err != nil {
		return err
	}
	if _, err := e.clear(name, false); err != nil {
		return err
	}
	// O_EXCL: never follow a symlink (or anything) at the final component.
	f, err := e.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := e.copySparse(f, name, tr); err != nil {
		return err
	}
	uid, gid := e.owner(hdr)
	if err := f.Chown(uid, gid); err != nil {
		return err
	}
	mode := hdr.FileInfo().Mode()
	if mode&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 {
		e.st.Stripped++
	}
	if err := f.Chmod(mode & fs.ModePerm); err != nil {
		return err
	}
	if err := setFileTimes(f, atimeOf(hdr), hdr.ModTime); err != nil {
		return err
	}
	return f.Close()
}

// holeBlock is the unit the extractor looks for zeros in: an aligned block
// of zeros is not written, so it stays a hole. It is a page (and the usual
// file system block), so that data scattered one byte per page in a box
// (a page of its disk each) takes no more than that on the host.
const holeBlock = 4 << 10

// copySparse writes the entry's contents into f (empty, just created),
// leaving every aligned block of zeros a hole: a layer's sparse files (and
// its runs of zeros) take on the host only the space of their data. The
// apparent size counts against MaxBytes, which bounds the time spent too.
func (e *extractor) copySparse(f *os.File, name string, r io.Reader) error {
	left := e.opt.MaxBytes - e.st.Bytes
	var off int64
	for {
		n, err := readFull(r, e.buf)
		if int64(n) > left-off {
			e.st.Bytes += off + int64(n)
			return fmt.Errorf("more than %d bytes of file data: %w", e.opt.MaxBytes, errLayerRejected)
		}
		if n > 0 {
			if werr := e.writeData(f, e.buf[:n], off); werr != nil {
				return fmt.Errorf("write %q: %w", name, werr)
			}
			off += int64(n)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			e.st.Bytes += off
			return fmt.Errorf("write %q: %w", name, err)
		}
	}
	e.st.Bytes += off
	// The size, whether the file ends in data or in a hole.
	if err := f.Truncate(off); err != nil {
		return fmt.Errorf("write %q: %w", name, err)
	}
	return nil
}

// writeData writes the blocks of b (at offset off of f) that are not all
// zeros, joining neighbours into one write.
func (e *extractor) writeData(f *os.File, b []byte, off int64) error {
	start := -1 // start of the pending run of data blocks
	for i := 0; i < len(b); i += holeBlock {
		blk := b[i:min(i+holeBlock, len(b))]
		if boxcopy.Zero(blk) {
			if start >= 0 {
				if _, err := f.WriteAt(b[start:i], off+int64(start)); err != nil {
					return err
				}
				e.st.Written += int64(i - start)
				start = -1
			}
			continue
		}
		if start < 0 {
			start = i
		}
	}
	if start >= 0 {
		if _, err := f.WriteAt(b[start:], off+int64(start)); err != nil {
			return err
		}
		e.st.Written += int64(len(b) - start)
	}
	return nil
}

// readFull reads into b until it is full or r ends: io.EOF with the bytes
// of the last, short read; any other error as it is (a truncated archive's
// io.ErrUnexpectedEOF included).
func readFull(r io.Reader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := r.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (e *extractor) symlink(name string, hdr *tar.Header) error {
	if name == "." {
		return fmt.Errorf("symlink named like the layer root: %w", errLayerRejected)
	}
	if len(hdr.Linkname) > maxNameLen || hdr.Linkname == "" {
		return fmt.Errorf("symlink target empty or longer than %d bytes: %w", maxNameLen, errLayerRejected)
	}
	if err := e.ensureParents(name); err != nil {
		return err
	}
	if _, err := e.clear(name, false); err != nil {
		return err
	}
	// The target is stored verbatim; it is resolved inside the sandbox.
	if err := e.root.Symlink(hdr.Linkname, name); err != nil {
		return err
	}
	uid, gid := e.owner(hdr)
	return e.root.Lchown(name, uid, gid)
}

func (e *extractor) hardlink(name string, hdr *tar.Header) error {
	target, err := cleanName(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hardlink target %q: %w", shorten(hdr.Linkname), err)
	}
	if name == "." || target == "." {
		return fmt.Errorf("hardlink to or from the layer root: %w", errLayerRejected)
	}
	if target == name {
		return nil // a link to itself: nothing to do (and clearing would lose the file)
	}
	fi, err := e.root.Lstat(target)
	if err != nil {
		return fmt.Errorf("hardlink target %q: %v: %w", hdr.Linkname, err, errLayerRejected)
	}
	if fi.IsDir() {
		return fmt.Errorf("hardlink target %q is a directory: %w", hdr.Linkname, errLayerRejected)
	}
	if err := e.ensureParents(name); err != nil {
		return err
	}
	if _, err := e.clear(name, false); err != nil {
		return err
	}
	return e.root.Link(target, name)
}

// whiteout handles ".wh.*" entries found in directory dir.
func (e *extractor) whiteout(dir, base string) error {
	if base == opaqueWhiteout {
		if err := e.ensureParents(dir + "/x"); err != nil {
			return err
		}
		return setOpaque(e.root, dir)
	}
	if strings.HasPrefix(base, ".wh..wh.") {
		e.st.Skipped++ // aufs metadata (.wh..wh.plnk, ...): meaningless here
		return nil
	}
	hidden := strings.TrimPrefix(base, ".wh.")
	if hidden == "" || hidden == "." || hidden == ".." {
		return fmt.Errorf("whiteout of %q: %w", hidden, errLayerRejected)
	}
	name := path.Join(dir, hidden)
	if err := e.ensureParents(name); err != nil {
		return err
	}
	if _, err := e.clear(name, false); err != nil {
		return err
	}
	return mkWhiteout(e.root, dir, hidden, e.mapID(0))
}

// classify marks err as a rejection of the layer unless it is the store's
// own trouble (disk full, I/O error) or a cancellation. Most failures of
// os.Root calls mean the layer tried to write through a symlink leading out
// of the root, or through a non-directory.
func classify(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, errLayerRejected), ctx.Err() != nil:
		return err
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT), errors.Is(err, syscall.EIO),
		errors.Is(err, syscall.EROFS), errors.Is(err, syscall.EPERM):
		return err
	}
	return fmt.Errorf("%v: %w", err, errLayerRejected)
}

// shorten keeps hostile names from flooding error messages and logs.
func shorten(name string) string {
	if len(name) <= 200 {
		return name
	}
	return name[:200] + "..."
}

// opaqueWhiteout marks its directory as opaque in OCI layers.
const opaqueWhiteout = ".wh..wh..opq"

func atimeOf(hdr *tar.Header) time.Time {
	if hdr.AccessTime.IsZero() {
		return hdr.ModTime
	}
	return hdr.AccessTime
}
