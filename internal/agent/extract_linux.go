package agent

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// extractTar extracts the tar read from r into the directory destFd (which
// it does not consume; dest was resolved by files) and returns how many non-directory entries and file bytes it wrote.
//
// The archive is hostile. Names are cleaned and a leading "/" dropped;
// names that climb out with ".." are refused. Every path is walked from an
// fd of dest one component at a time with O_NOFOLLOW, so a symlink planted by
// an earlier entry (or already there) is never followed; an existing final
// entry is unlinked, never written through. Hard links must name an entry
// inside dest; symlinks whose target leaves dest are refused, read alone
// and then, once every entry exists, resolved by the kernel beneath dest
// (checkLinks: a chain of links that each look inside can lead out); devices are
// refused; setuid, setgid bits are stripped. Every directory opened is
// checked like any path of the file API (boxFS.check): an archive
// extracted into "/" cannot write into the agent's own /proc directory.
func extractTar(ctx context.Context, bfs *boxFS, fw *fileWriter, destFd int, r io.Reader) (files, bytes int64, err error) {
	rootFd, err := unix.FcntlInt(uintptr(destFd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return 0, 0, fmt.Errorf("duplicating the destination's handle: %w", err)
	}
	x := &extractor{root: rootFd, dirs: make(map[string]int), bfs: bfs}
	defer x.close()

	var links []string // symlinks made, checked once every entry is in place
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files, bytes, x.checkLinks(links)
		}
		if err != nil {
			return files, bytes, fmt.Errorf("reading tar: %w", err)
		}
		if err := ctx.Err(); err != nil {
			return files, bytes, err
		}
		name, ok := cleanName(hdr.Name)
		if !ok {
			return files, bytes, badEntry(hdr.Name, "escapes the destination")
		}
		if name == "" {
			continue // "./" or "/": the destination itself
		}
		dir, base := path.Split(name)
		mode := uint32(hdr.Mode) & 0o1777 // no setuid, setgid
		switch hdr.Typeflag {
		case tar.TypeDir:
			parent, err := x.dir(strings.TrimSuffix(dir, "/"))
			if err != nil {
				return files, bytes, entryError(hdr.Name, err)
			}
			err = unix.Mkdirat(parent, base, mode|0o700)
			if errors.Is(err, unix.EEXIST) {
				var st unix.Stat_t
				if err = unix.Fstatat(parent, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
					err = unix.ENOTDIR
				}
			}
			if err != nil {
				return files, bytes, entryError(hdr.Name, err)
			}
			continue
		case tar.TypeReg, tar.TypeChar, tar.TypeBlock, tar.TypeFifo, tar.TypeSymlink, tar.TypeLink:
		default:
			continue // pax/gnu metadata the reader did not consume, etc.
		}
		if hdr.Typeflag == tar.TypeChar || hdr.Typeflag == tar.TypeBlock {
			return files, bytes, badEntry(hdr.Name, "device nodes are not allowed")
		}
		parent, err := x.dir(strings.TrimSuffix(dir, "/"))
		if err != nil {
			return files, bytes, entryError(hdr.Name, err)
		}
		if err := unlinkNonDir(parent, base); err != nil {
			return files, bytes, entryError(hdr.Name, err)
		}
		switch hdr.Typeflag {
		case tar.TypeReg:
			n, err := writeEntry(ctx, fw, parent, base, mode, hdr.ModTime, tr)
			bytes += n
			if err != nil {
				return files, bytes, entryError(hdr.Name, err)
			}
		case tar.TypeFifo:
			if err := unix.Mkfifoat(parent, base, mode); err != nil {
				return files, bytes, entryError(hdr.Name, err)
			}
		case tar.TypeSymlink:
			if !symlinkInside(name, hdr.Linkname) {
				return files, bytes, badEntry(hdr.Name, fmt.Sprintf("symlink target %q leaves the destination", hdr.Linkname))
			}
			if err := unix.Symlinkat(hdr.Linkname, parent, base); err != nil {
				return files, bytes, entryError(hdr.Name, err)
			}
			links = append(links, name)
		case tar.TypeLink:
			target, ok := cleanName(hdr.Linkname)
			if !ok || target == "" || strings.HasPrefix(hdr.Linkname, "/") {
				return files, bytes, badEntry(hdr.Name, fmt.Sprintf("hard link target %q leaves the destination", hdr.Linkname))
			}
			tdir, tbase := path.Split(target)
			tparent, err := x.dir(strings.TrimSuffix(tdir, "/"))
			if err != nil {
				return files, bytes, entryError(hdr.Name, err)
			}
			// Flags 0: a symlink target is linked itself, not followed.
			if err := unix.Linkat(tparent, tbase, parent, base, 0); err != nil {
				return files, bytes, entryError(hdr.Name, err)
			}
			// A hard link to a symlink is that symlink under a second
			// name: checked at the end like it.
			var st unix.Stat_t
			if err := unix.Fstatat(parent, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				links = append(links, name)
			}
		}
		files++
	}
}

// checkLinks resolves every symlink the archive made, now that all its
// entries exist, by the kernel from the destination with RESOLVE_BENEATH:
// symlinkInside reads a target alone, and "l -> s/x/.." is inside by
// itself but the destination's parent once "s/x -> .." exists (an entry
// that may come after l). Every link whose resolution leaves the
// destination is removed (a hard link to a symlink is listed too) and the
// first fails the upload with its name; a dangling one stays (nothing it
// names exists to lead anywhere).
func (x *extractor) checkLinks(links []string) error {
	var first error // every escaping link is removed; the first one is named
	for _, name := range links {
		how := unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
		}
		fd, err := unix.Openat2(x.root, name, &how)
		if err == nil {
			unix.Close(fd)
			continue
		}
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			continue
		}
		var target string
		buf := make([]byte, 4096)
		if n, rerr := unix.Readlinkat(x.root, name, buf); rerr == nil {
			target = string(buf[:n])
		}
		dir, base := path.Split(name)
		if parent, derr := x.dir(strings.TrimSuffix(dir, "/")); derr == nil {
			unix.Unlinkat(parent, base, 0)
		}
		if first != nil {
			continue
		}
		if errors.Is(err, unix.EXDEV) {
			first = badEntry(name, fmt.Sprintf("symlink target %q leads out of the destination through other links", target))
		} else {
			first = entryError(name, fmt.Errorf("resolving symlink target %q: %w", target, err))
		}
	}
	return first
}

// extractor holds fds of directories already walked to, relative to root.
// Extraction never removes or renames directories, so a cached fd stays the
// directory at that name.
type extractor struct {
	root int
	dirs map[string]int
	bfs  *boxFS
}

func (x *extractor) close() {
	for _, fd := range x.dirs {
		unix.Close(fd)
	}
	unix.Close(x.root)
}

// dir returns an fd of the directory rel (slash-separated, cleaned, "" for
// root), creating missing components 0755 and never following a symlink.
func (x *extractor) dir(rel string) (int, error) {
	if rel == "" {
		return x.root, nil
	}
	if fd, ok := x.dirs[rel]; ok {
		return fd, nil
	}
	parentRel, base := path.Split(rel)
	parent, err := x.dir(strings.TrimSuffix(parentRel, "/"))
	if err != nil {
		return -1, err
	}
	flags := unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Openat(parent, base, flags, 0)
	if errors.Is(err, unix.ENOENT) {
		if err = unix.Mkdirat(parent, base, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
			fd, err = unix.Openat(parent, base, flags, 0)
		}
	}
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return -1, fmt.Errorf("%s is not a directory (symlinks are not followed): %w", rel, unix.ENOTDIR)
	}
	if err != nil {
		return -1, fmt.Errorf("opening %s: %w", rel, err)
	}
	if err := x.bfs.check(fd); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("opening %s: %w", rel, err)
	}
	if len(x.dirs) >= 1024 {
		for k, v := range x.dirs {
			unix.Close(v)
			delete(x.dirs, k)
		}
	}
	x.dirs[rel] = fd
	return fd, nil
}

// unlinkNonDir removes an existing non-directory at parent/name so a new
// entry replaces it instead of writing through it.
func unlinkNonDir(parent int, name string) error {
	var st unix.Stat_t
	err := unix.Fstatat(parent, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return unix.EISDIR
	}
	return unix.Unlinkat(parent, name, 0)
}

// writeEntry creates parent/name exclusively and copies r into it through
// fw (so its pages are charged to user code's cgroup; see fileWriter).
func writeEntry(ctx context.Context, fw *fileWriter, parent int, name string, mode uint32, mtime time.Time, r io.Reader) (int64, error) {
	fd, err := unix.Openat(parent, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return 0, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	sink, err := fw.sink(ctx, f)
	if err != nil {
		return 0, err
	}
	if _, err := io.Copy(sink, r); err != nil {
		sink.abort()
		return 0, err
	}
	n, err := sink.finish()
	if err != nil {
		return n, err
	}
	// fchmod after writing: the umask does not apply and the bits are final.
	if err := unix.Fchmod(fd, mode); err != nil {
		return n, err
	}
	if !mtime.IsZero() {
		tv := unix.NsecToTimeval(mtime.UnixNano())
		unix.Futimes(fd, []unix.Timeval{tv, tv})
	}
	return n, f.Close()
}

// cleanName turns an archive name into a clean slash path relative to the
// destination, dropping a leading "/". ok is false if it climbs out.
func cleanName(name string) (clean string, ok bool) {
	for _, elem := range strings.Split(name, "/") {
		if elem == ".." {
			return "", false
		}
	}
	clean = strings.TrimPrefix(path.Clean("/"+name), "/")
	return clean, true
}

// symlinkInside reports whether a symlink at name (relative to the
// destination) pointing to target resolves, lexically, inside it.
func symlinkInside(name, target string) bool {
	if target == "" || path.IsAbs(target) {
		return false
	}
	p := path.Join(path.Dir(name), target)
	return p != ".." && !strings.HasPrefix(p, "../")
}

// entryError wraps an error extracting one entry.
func entryError(name string, err error) error {
	return fmt.Errorf("extracting %q: %w", name, err)
}
