package safepath

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// resolveFlags never follow a symlink or magic link and never leave the root.
const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// chunk bounds the bytes handed to one openat2 call: longer paths (a sandbox
// can nest directories far past PATH_MAX) are resolved a chunk of components
// at a time from the previous chunk's handle.
const chunk = 2048

// Root is an open handle on the top of a hostile tree. Its methods are safe
// for concurrent use; Close must not race them.
type Root struct {
	fd   int
	name string
}

// OpenRoot opens the directory dir as a Root. dir itself is a host-chosen
// path (the data dir and the names under it are the daemon's); only what is
// below it is treated as hostile.
func OpenRoot(dir string) (*Root, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open root", Path: dir, Err: err}
	}
	return &Root{fd: fd, name: dir}, nil
}

// Name is the path the root was opened with (for messages on the host only:
// do not return it to API clients).
func (r *Root) Name() string { return r.name }

// Close releases the root's handle.
func (r *Root) Close() error {
	if r.fd < 0 {
		return nil
	}
	err := unix.Close(r.fd)
	r.fd = -1
	return err
}

// OpenRoot opens the directory rel below r as a Root of its own.
func (r *Root) OpenRoot(rel string) (*Root, error) {
	fd, err := r.resolve("open", rel, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	return &Root{fd: fd, name: path.Join(r.name, rel)}, nil
}

// pathErr wraps a resolution error, naming the class of refusal.
func pathErr(op, rel string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		err = fmt.Errorf("%w (%w)", ErrSymlink, unix.ELOOP)
	case errors.Is(err, unix.EXDEV):
		err = fmt.Errorf("%w (%w)", ErrEscape, unix.EXDEV)
	}
	return &fs.PathError{Op: op, Path: rel, Err: err}
}

// openat2 resolves one chunk (retrying the kernel's EAGAIN, which it returns
// when a concurrent rename might have moved something under it).
func openat2(dirfd int, p string, flags uint64, mode uint32) (int, error) {
	how := &unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Mode: uint64(mode), Resolve: resolveFlags}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, p, how)
		if err == unix.EAGAIN && i < 16 {
			continue
		}
		if err == unix.ENOSYS {
			return -1, fmt.Errorf("openat2 is not available (Linux 5.6 or newer is required): %w", err)
		}
		return fd, err
	}
}

// resolve opens rel (cleaned) with flags, never following a symlink.
func (r *Root) resolve(op, rel string, flags uint64, mode uint32) (int, error) {
	c, err := Clean(rel)
	if err != nil {
		return -1, err
	}
	// RESOLVE_NO_SYMLINKS refuses a trailing symlink too (ELOOP), unless
	// the caller asks for the link itself with O_PATH|O_NOFOLLOW. Adding
	// O_NOFOLLOW here would turn some refusals into ENOTDIR.
	dirfd, owned := r.fd, false
	for len(c) > chunk {
		i := strings.LastIndexByte(c[:chunk], '/')
		if i <= 0 {
			if owned {
				unix.Close(dirfd)
			}
			return -1, pathErr(op, rel, unix.ENAMETOOLONG)
		}
		fd, err := openat2(dirfd, c[:i], unix.O_PATH|unix.O_DIRECTORY, 0)
		if owned {
			unix.Close(dirfd)
		}
		if err != nil {
			return -1, pathErr(op, rel, err)
		}
		dirfd, owned, c = fd, true, c[i+1:]
	}
	fd, err := openat2(dirfd, c, flags, mode)
	if owned {
		unix.Close(dirfd)
	}
	if err != nil {
		return -1, pathErr(op, rel, err)
	}
	return fd, nil
}

// parent opens the directory holding rel's final component and returns its
// handle and the component's name.
func (r *Root) parent(op, rel string) (int, string, error) {
	c, err := Clean(rel)
	if err != nil {
		return -1, "", err
	}
	if c == "." {
		return -1, "", &fs.PathError{Op: op, Path: rel, Err: errors.New("not allowed on the root itself")}
	}
	dir, name := split(c)
	fd, err := r.resolve(op, dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, "", err
	}
	return fd, name, nil
}

// OpenFile opens rel like os.OpenFile, refusing a symlink in any component
// (the final one included).
func (r *Root) OpenFile(rel string, flag int, perm fs.FileMode) (*os.File, error) {
	fd, err := r.resolve("open", rel, uint64(flag), uint32(perm.Perm()))
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), path.Base(rel)), nil
}

// Open opens rel for reading.
func (r *Root) Open(rel string) (*os.File, error) {
	return r.OpenFile(rel, os.O_RDONLY, 0)
}

// Lstat describes rel itself (a symlink as a symlink). Sys() of the result
// is a *unix.Stat_t (see Stat).
func (r *Root) Lstat(rel string) (fs.FileInfo, error) {
	c, err := Clean(rel)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if c == "." {
		if err := unix.Fstat(r.fd, &st); err != nil {
			return nil, &fs.PathError{Op: "lstat", Path: rel, Err: err}
		}
		return newInfo(".", &st), nil
	}
	pfd, name, err := r.parent("lstat", c)
	if err != nil {
		return nil, err
	}
	defer unix.Close(pfd)
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, &fs.PathError{Op: "lstat", Path: rel, Err: err}
	}
	return newInfo(name, &st), nil
}

// Readlink returns the target of the symlink rel (never following it).
func (r *Root) Readlink(rel string) (string, error) {
	pfd, name, err := r.parent("readlink", rel)
	if err != nil {
		return "", err
	}
	defer unix.Close(pfd)
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(pfd, name, buf)
		if err != nil {
			return "", &fs.PathError{Op: "readlink", Path: rel, Err: err}
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// ReadDir lists the directory rel, sorted by name, with each entry's
// attributes read (never following it).
func (r *Root) ReadDir(rel string) ([]Entry, error) {
	fd, err := r.resolve("readdir", rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	es, err := readDirFd(fd)
	if err != nil {
		return nil, &fs.PathError{Op: "readdir", Path: rel, Err: err}
	}
	return es, nil
}

// readDirFd lists an open directory (the fd is not consumed).
func readDirFd(fd int) ([]Entry, error) {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "dir")
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	out := make([]Entry, 0, len(names))
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // removed since listed
			}
			return nil, fmt.Errorf("stat %s: %w", n, err)
		}
		out = append(out, Entry{info: newInfo(n, &st)})
	}
	return out, nil
}

// Walk calls fn for every entry below rel (not rel itself), parents before
// children, names sorted. Directories are entered through the handle of
// their parent, never through a symlink, so a directory swapped for a symlink while
// the walk runs ends it with ErrSymlink instead of leading it elsewhere.
// Depth is not limited by PATH_MAX.
func (r *Root) Walk(rel string, fn WalkFunc) error {
	c, err := Clean(rel)
	if err != nil {
		return err
	}
	fd, err := r.resolve("walk", c, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	prefix := ""
	if c != "." {
		prefix = c + "/"
	}
	return walkFd(fd, prefix, fn)
}

func walkFd(fd int, prefix string, fn WalkFunc) error {
	es, err := readDirFd(fd)
	if err != nil {
		return &fs.PathError{Op: "walk", Path: strings.TrimSuffix(prefix, "/"), Err: err}
	}
	for _, e := range es {
		rel := prefix + e.Name()
		err := fn(rel, e)
		if err == fs.SkipDir {
			if e.IsDir() {
				continue
			}
			return nil
		}
		if err != nil {
			return err
		}
		if !e.IsDir() {
			continue
		}
		cfd, err := openat2(fd, e.Name(), unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return pathErr("walk", rel, err)
		}
		err = walkFd(cfd, rel+"/", fn)
		unix.Close(cfd)
		if err != nil {
			return err
		}
	}
	return nil
}

// Mkdir makes the directory rel (its parent must exist).
func (r *Root) Mkdir(rel string, perm fs.FileMode) error {
	pfd, name, err := r.parent("mkdir", rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := unix.Mkdirat(pfd, name, uint32(perm.Perm())); err != nil {
		return &fs.PathError{Op: "mkdir", Path: rel, Err: err}
	}
	return nil
}

// Symlink makes rel a symlink to target (which is not looked at).
func (r *Root) Symlink(target, rel string) error {
	pfd, name, err := r.parent("symlink", rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := unix.Symlinkat(target, pfd, name); err != nil {
		return &fs.PathError{Op: "symlink", Path: rel, Err: err}
	}
	return nil
}

// Link makes rel a hard link to src's srcRel (never following it).
func (r *Root) Link(src *Root, srcRel, rel string) error {
	spfd, sname, err := src.parent("link", srcRel)
	if err != nil {
		return err
	}
	defer unix.Close(spfd)
	pfd, name, err := r.parent("link", rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := unix.Linkat(spfd, sname, pfd, name, 0); err != nil {
		return &fs.PathError{Op: "link", Path: rel, Err: err}
	}
	return nil
}

// Rename moves oldRel to newRel within the root (never following either).
func (r *Root) Rename(oldRel, newRel string) error {
	opfd, oname, err := r.parent("rename", oldRel)
	if err != nil {
		return err
	}
	defer unix.Close(opfd)
	npfd, nname, err := r.parent("rename", newRel)
	if err != nil {
		return err
	}
	defer unix.Close(npfd)
	if err := unix.Renameat(opfd, oname, npfd, nname); err != nil {
		return &fs.PathError{Op: "rename", Path: oldRel, Err: err}
	}
	return nil
}

// Remove removes the file, symlink or empty directory rel.
func (r *Root) Remove(rel string) error {
	pfd, name, err := r.parent("remove", rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	err = unix.Unlinkat(pfd, name, 0)
	if err == unix.EISDIR {
		err = unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR)
	}
	if err != nil {
		return &fs.PathError{Op: "remove", Path: rel, Err: err}
	}
	return nil
}

// RemoveAll removes rel and everything below it; a missing rel is not an
// error. Directories are entered through their parent's handle, never
// through a symlink: a symlink anywhere is removed, never followed.
func (r *Root) RemoveAll(rel string) error {
	pfd, name, err := r.parent("remove", rel)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
			return nil
		}
		return err
	}
	defer unix.Close(pfd)
	if err := RemoveAllAt(pfd, name); err != nil {
		return &fs.PathError{Op: "remove", Path: rel, Err: err}
	}
	return nil
}

// RemoveAllAt removes the entry name of the open directory pfd and
// everything below it, entering directories through their parent's handle,
// never through a symlink; a missing name is not an error. For callers that
// hold a directory handle of their own (the agent's file service).
func RemoveAllAt(pfd int, name string) error {
	for attempt := 0; ; attempt++ {
		err := unix.Unlinkat(pfd, name, 0)
		if err == nil || err == unix.ENOENT {
			return nil
		}
		if err != unix.EISDIR && err != unix.EPERM {
			return err
		}
		err = unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR)
		if err == nil || err == unix.ENOENT {
			return nil
		}
		if (err != unix.ENOTEMPTY && err != unix.EEXIST) || attempt >= 8 {
			return err
		}
		fd, err := openat2(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			if err == unix.ENOENT {
				return nil
			}
			return err
		}
		es, err := readDirFd(fd)
		if err == nil {
			for _, e := range es {
				if err = RemoveAllAt(fd, e.Name()); err != nil {
					break
				}
			}
		}
		unix.Close(fd)
		if err != nil {
			return err
		}
	}
}

// Lchown changes the owner of rel itself.
func (r *Root) Lchown(rel string, uid, gid int) error {
	c, err := Clean(rel)
	if err != nil {
		return err
	}
	if c == "." {
		if err := unix.Fchownat(r.fd, "", uid, gid, unix.AT_EMPTY_PATH); err != nil {
			return &fs.PathError{Op: "lchown", Path: rel, Err: err}
		}
		return nil
	}
	pfd, name, err := r.parent("lchown", c)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := unix.Fchownat(pfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "lchown", Path: rel, Err: err}
	}
	return nil
}

// Chmod changes the mode of rel, which must not be a symlink.
func (r *Root) Chmod(rel string, mode fs.FileMode) error {
	fd, err := r.resolve("chmod", rel, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &fs.PathError{Op: "chmod", Path: rel, Err: err}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return &fs.PathError{Op: "chmod", Path: rel, Err: ErrSymlink}
	}
	// An O_PATH handle cannot be fchmod'ed; its /proc/self/fd link names
	// exactly the object it holds (glibc does the same for
	// fchmodat(AT_SYMLINK_NOFOLLOW) on kernels without fchmodat2).
	if err := unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), unixMode(mode)); err != nil {
		return &fs.PathError{Op: "chmod", Path: rel, Err: err}
	}
	return nil
}

// Chtimes sets the access and modification times of rel itself.
func (r *Root) Chtimes(rel string, atime, mtime time.Time) error {
	pfd, name, err := r.parent("chtimes", rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	ts := []unix.Timespec{unix.NsecToTimespec(atime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
	if err := unix.UtimesNanoAt(pfd, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "chtimes", Path: rel, Err: err}
	}
	return nil
}

// Getxattr reads the extended attribute attr of the directory or regular
// file rel (never following it); ok is false when it is not set.
func (r *Root) Getxattr(rel, attr string) (val []byte, ok bool, err error) {
	fd, err := r.resolve("getxattr", rel, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, false, err
	}
	defer unix.Close(fd)
	buf := make([]byte, 256)
	n, err := unix.Fgetxattr(fd, attr, buf)
	if err == unix.ENODATA || err == unix.ENOTSUP {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, &fs.PathError{Op: "getxattr", Path: rel, Err: err}
	}
	return buf[:n], true, nil
}

func unixMode(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		u |= unix.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		u |= unix.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		u |= unix.S_ISVTX
	}
	return u
}

// Entry is a directory entry with its attributes.
type Entry struct{ info *fileInfo }

func (e Entry) Name() string               { return e.info.name }
func (e Entry) IsDir() bool                { return e.info.IsDir() }
func (e Entry) Type() fs.FileMode          { return e.info.Mode().Type() }
func (e Entry) Info() (fs.FileInfo, error) { return e.info, nil }

// Stat is the entry's raw attributes.
func (e Entry) Stat() *unix.Stat_t { return &e.info.st }

// fileInfo is an fs.FileInfo made from a stat.
type fileInfo struct {
	name string
	st   unix.Stat_t
}

func newInfo(name string, st *unix.Stat_t) *fileInfo { return &fileInfo{name: name, st: *st} }

// FileInfo describes an entry named name from its lstat (tar headers,
// listings); Sys() is a *unix.Stat_t.
func FileInfo(name string, st *unix.Stat_t) fs.FileInfo { return newInfo(name, st) }

func (fi *fileInfo) Name() string       { return fi.name }
func (fi *fileInfo) Size() int64        { return fi.st.Size }
func (fi *fileInfo) ModTime() time.Time { return time.Unix(fi.st.Mtim.Unix()) }
func (fi *fileInfo) IsDir() bool        { return fi.Mode().IsDir() }
func (fi *fileInfo) Sys() any           { return &fi.st }
func (fi *fileInfo) Mode() fs.FileMode {
	m := fs.FileMode(fi.st.Mode & 0o777)
	switch fi.st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		m |= fs.ModeDir
	case unix.S_IFLNK:
		m |= fs.ModeSymlink
	case unix.S_IFIFO:
		m |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		m |= fs.ModeSocket
	case unix.S_IFCHR:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		m |= fs.ModeDevice
	}
	if fi.st.Mode&unix.S_ISUID != 0 {
		m |= fs.ModeSetuid
	}
	if fi.st.Mode&unix.S_ISGID != 0 {
		m |= fs.ModeSetgid
	}
	if fi.st.Mode&unix.S_ISVTX != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// Stat returns the raw attributes behind a FileInfo from this package (nil
// for any other).
func Stat(fi fs.FileInfo) *unix.Stat_t {
	s, _ := fi.Sys().(*unix.Stat_t)
	return s
}
