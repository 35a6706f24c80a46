//go:build linux

package oci

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
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
// walked with openat/fstatat relative to directory fds and O_NOFOLLOW: no
// symlink in it is ever followed, and a symlink is captured as a symlink.
func (d *Driver) Diff(ctx context.Context, h runtime.Handle, w io.Writer) (err error) {
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
	fd, err := unix.Open(upper, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("snapshot box %s: no writable layer: %w", h.ID, errdefs.ErrNotFound)
		}
		return fmt.Errorf("snapshot box %s: open writable layer: %w", h.ID, err)
	}
	dw := &diffWriter{ctx: ctx, tw: tar.NewWriter(w), links: map[fileID]string{}, buf: make([]byte, 1<<20)}
	err = dw.dir(fd, "")
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("snapshot box %s: %w", h.ID, err)
	}
	if err := dw.tw.Close(); err != nil {
		return fmt.Errorf("snapshot box %s: %w", h.ID, err)
	}
	if dw.skipped > 0 {
		d.log.Debug("snapshot: entries left out (sockets, FIFOs, devices, literal .wh. names)", "id", h.ID, "count", dw.skipped)
	}
	return nil
}

type fileID struct{ dev, ino uint64 }

// diffWriter turns one upper dir into tar entries.
type diffWriter struct {
	ctx     context.Context
	tw      *tar.Writer
	links   map[fileID]string // first name of each multiply-linked file
	buf     []byte
	skipped int
}

// dir writes the entries of the directory open at fd, whose name in the
// layer is rel ("" for the root).
func (dw *diffWriter) dir(fd int, rel string) error {
	names, err := readDirNames(fd)
	if err != nil {
		return fmt.Errorf("read %s: %w", displayName(rel), err)
	}
	slices.Sort(names) // the same tree gives the same tar
	for _, name := range names {
		if err := dw.ctx.Err(); err != nil {
			return err
		}
		child := name
		if rel != "" {
			child = rel + "/" + name
		}
		if diffExcluded[child] {
			continue
		}
		if err := dw.entry(fd, name, child); err != nil {
			return err
		}
	}
	return nil
}

func (dw *diffWriter) entry(dirfd int, name, rel string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("stat %s: %w", displayName(rel), err)
	}
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
		target, err := readLinkAt(dirfd, name)
		if err != nil {
			return fmt.Errorf("read link %s: %w", displayName(rel), err)
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		return dw.tw.WriteHeader(hdr)
	case unix.S_IFDIR:
		return dw.subdir(dirfd, name, rel, hdr)
	case unix.S_IFREG:
		if strings.HasPrefix(name, ".wh.") {
			dw.skipped++ // cannot be told apart from a whiteout in a layer
			return nil
		}
		return dw.file(dirfd, name, rel, hdr, &st)
	}
	dw.skipped++ // sockets, FIFOs, device nodes
	return nil
}

func (dw *diffWriter) subdir(dirfd int, name, rel string, hdr *tar.Header) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", displayName(rel), err)
	}
	defer unix.Close(fd)
	if hasXattr(fd, "trusted.overlay.redirect") || hasXattr(fd, "user.overlay.redirect") {
		return fmt.Errorf("%s is a renamed lower directory (overlayfs redirect_dir): not supported: %w",
			displayName(rel), errdefs.ErrFailedPrecondition)
	}
	hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
	if err := dw.tw.WriteHeader(hdr); err != nil {
		return err
	}
	if isOpaque(fd) {
		if err := dw.tw.WriteHeader(&tar.Header{Name: rel + "/.wh..wh..opq", Typeflag: tar.TypeReg,
			Mode: 0o600, ModTime: hdr.ModTime}); err != nil {
			return err
		}
	}
	if diffEmptied[rel] {
		return nil
	}
	return dw.dir(fd, rel)
}

func (dw *diffWriter) file(dirfd int, name, rel string, hdr *tar.Header, st *unix.Stat_t) error {
	id := fileID{dev: st.Dev, ino: st.Ino}
	if st.Nlink > 1 {
		if first, ok := dw.links[id]; ok {
			hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
			return dw.tw.WriteHeader(hdr)
		}
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", displayName(rel), err)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
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
	if err := dw.tw.WriteHeader(hdr); err != nil {
		return err
	}
	// Hide os.File's WriterTo so that our buffer is used.
	n, err := io.CopyBuffer(dw.tw, io.LimitReader(struct{ io.Reader }{f}, fst.Size), dw.buf)
	if err != nil {
		return fmt.Errorf("read %s: %w", displayName(rel), err)
	}
	if n != fst.Size {
		return fmt.Errorf("%s shrank while being read", displayName(rel))
	}
	if st.Nlink > 1 {
		dw.links[id] = rel
	}
	return nil
}

// boxID maps a host uid or gid back to the box's view: the mapped range
// shifts down, anything else shows up as nobody (as it does in the box).
func boxID(id uint32) int {
	if id >= idMapBase && id < idMapBase+idMapSize {
		return int(id - idMapBase)
	}
	return 65534
}

func readDirNames(fd int) ([]string, error) {
	// A dup, so that closing the os.File leaves fd to the caller.
	nfd, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(nfd), "dir")
	defer f.Close()
	if _, err := unix.Seek(nfd, 0, io.SeekStart); err != nil {
		return nil, err
	}
	return f.Readdirnames(-1)
}

func readLinkAt(dirfd int, name string) (string, error) {
	for size := 256; size <= 1<<16; size *= 4 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
	return "", fmt.Errorf("symlink target too long")
}

func hasXattr(fd int, attr string) bool {
	n, err := unix.Fgetxattr(fd, attr, nil)
	return err == nil && n >= 0
}

// isOpaque reports whether the directory open at fd hides the lower
// directories of the same name.
func isOpaque(fd int) bool {
	buf := make([]byte, 8)
	for _, attr := range []string{"trusted.overlay.opaque", "user.overlay.opaque"} {
		if n, err := unix.Fgetxattr(fd, attr, buf); err == nil && n == 1 && buf[0] == 'y' {
			return true
		}
	}
	return false
}

// displayName keeps names chosen inside the box short in error messages.
func displayName(rel string) string {
	rel = "/" + rel
	if len(rel) > 200 {
		return fmt.Sprintf("%q...", rel[:200])
	}
	return fmt.Sprintf("%q", rel)
}
