package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/safepath"
)

// boxFS is the one way the agent's file service (files_linux.go,
// tar_linux.go, UploadTar's extraction, Configure's workdir, the user
// lookups) turns a path a client named into an open file. The agent is
// PID 1 of the sandbox and holds handles user code cannot reach (the
// backing trees of path guards, its log, its sockets), and it may follow
// what user code may not: its own /proc/1/{fd,root,cwd,...} links. User
// code plants the paths the agent is asked to open, so the file API must
// resolve them exactly as user code would, never with the agent's extra
// reach:
//
//   - Every client path is resolved from the sandbox's "/" with
//     openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS). Ordinary symlinks
//     are followed (user code can follow them itself), absolute ones
//     relative to the sandbox's root, through the mounts user code sees, so
//     a guarded directory is always seen through its permission layer.
//     Magic links (/proc/<pid>/fd/N, root, cwd, exe, map_files/...), and
//     symlinks leading to them, fail with ELOOP.
//   - A handle that lands on procfs is refused if it is inside the agent's
//     own /proc/<pid> directory (any of its threads' ids: /proc/1,
//     /proc/self, /proc/thread-self): environ, mem, fdinfo, maps... of the
//     agent are not user code's to read. The one exception is
//     /proc/<agent>/net, the network namespace's tables, which user code
//     reads the same at /proc/self/net (the daemon's port listing reads
//     /proc/net/tcp).
//   - Operations on a final component (stat, readlink, remove, rename,
//     mkdir, the rename of a written file into place) act on the name
//     through its parent's handle and never follow it.
//   - Checks are made on the handle that is then used (fstat, not a stat
//     of the path before an open), so a path swapped between the two
//     cannot change what is read or written.
//   - Walks (ListDir, DownloadTar) enter directories through their parent's
//     handle with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//     RESOLVE_NO_MAGICLINKS: symlinks below the walked directory are
//     listed as symlinks, never followed.
type boxFS struct {
	// root is an O_PATH handle on the sandbox's "/" (the agent's root).
	root int
	// procDev is st_dev of /proc (0 if /proc is not procfs), to recognise
	// the top of procfs during walks.
	procDev uint64
}

// procRootIno is the inode number of the top directory of every procfs.
const procRootIno = 1

// newBoxFS opens the sandbox's root.
func newBoxFS() (*boxFS, error) {
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the sandbox's root: %w", err)
	}
	b := &boxFS{root: fd}
	var sfs unix.Statfs_t
	var st unix.Stat_t
	if unix.Statfs("/proc", &sfs) == nil && sfs.Type == unix.PROC_SUPER_MAGIC && unix.Stat("/proc", &st) == nil {
		b.procDev = st.Dev
	}
	return b, nil
}

// openat2 retries the kernel's EAGAIN (a concurrent rename) and EINTR.
func openat2(dirfd int, rel string, flags int, mode uint32, resolve uint64) (int, error) {
	how := &unix.OpenHow{Flags: uint64(flags) | unix.O_CLOEXEC, Resolve: resolve}
	if flags&(unix.O_CREAT|unix.O_TMPFILE) != 0 {
		how.Mode = uint64(mode)
	}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, rel, how)
		if (err == unix.EAGAIN || err == unix.EINTR) && i < 16 {
			continue
		}
		if err == unix.ELOOP {
			// Keep ELOOP for errors.Is; say what it usually means here.
			return -1, fmt.Errorf("%w (a symlink loop, or a /proc magic link such as /proc/<pid>/fd/N, root or cwd, which the file API never follows)", err)
		}
		return fd, err
	}
}

// beneath resolves names below an already open directory without
// following any symlink.
const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// resolve opens the absolute, cleaned path p as user code would (see
// boxFS) with flags, and refuses what it lands on if that is the agent's
// own /proc directory.
func (b *boxFS) resolve(p string, flags int, mode uint32) (int, error) {
	rel := strings.TrimPrefix(p, "/")
	if rel == "" {
		rel = "."
	}
	fd, err := openat2(b.root, rel, flags, mode, unix.RESOLVE_IN_ROOT|unix.RESOLVE_NO_MAGICLINKS)
	if err != nil {
		return -1, err
	}
	if err := b.check(fd); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// check refuses a handle inside the agent's own /proc/<pid> directory
// (other than its net/), or on a procfs reached other than through /proc.
func (b *boxFS) check(fd int) error {
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return err
	}
	if sfs.Type != unix.PROC_SUPER_MAGIC {
		return nil
	}
	// The kernel's own name for what the handle holds (the agent's fd
	// table is its own to read).
	where, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return fmt.Errorf("naming a procfs handle: %w", err)
	}
	return checkProcPath(where)
}

// checkProcPath applies check's rule to a procfs path as the kernel names it.
func checkProcPath(where string) error {
	if where == "/proc" {
		return nil
	}
	rest, ok := strings.CutPrefix(where, "/proc/")
	if !ok {
		return errProcElsewhere
	}
	first, sub, _ := strings.Cut(rest, "/")
	if !isAgentTask(first) {
		return nil
	}
	if sub == "net" || strings.HasPrefix(sub, "net/") {
		return nil
	}
	return errAgentProc
}

// isAgentTask reports whether name (a /proc entry) is the id of the agent
// process or one of its threads.
func isAgentTask(name string) bool {
	if name == "" || strings.Trim(name, "0123456789") != "" {
		return false
	}
	if name == strconv.Itoa(os.Getpid()) {
		return true
	}
	return unix.Access("/proc/self/task/"+name, unix.F_OK) == nil
}

// parent resolves the directory holding p's final component (see
// resolve) and returns an O_PATH handle on it and the component's name.
// p must not be "/".
func (b *boxFS) parent(p string) (int, string, error) {
	dir, name := path.Split(p)
	if name == "" {
		return -1, "", fmt.Errorf("%w: not allowed on the root directory", unix.EINVAL)
	}
	fd, err := b.resolve(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, "", err
	}
	return fd, name, nil
}

// openRead opens p for reading (following ordinary symlinks). Opening does
// not block on a FIFO; what was opened is checked on the handle: a
// directory fails with EISDIR, a FIFO, socket or other non-file with
// errNotRegular, except character devices (/dev/urandom is a fine read).
func (b *boxFS) openRead(p string) (*os.File, error) {
	fd, err := b.resolve(p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if errors.Is(err, unix.ENXIO) {
		return nil, errNotRegular // a socket
	}
	if err != nil {
		return nil, err
	}
	if err := blockingRegular(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), p), nil
}

// errNotRegular refuses FIFOs, sockets and the like where file data is
// read or written.
var errNotRegular = fmt.Errorf("%w: not a regular file", unix.EINVAL)

// blockingRegular checks that fd is a regular file (or, if devOK, a
// character device) and clears O_NONBLOCK.
func blockingRegular(fd int, devOK bool) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		return unix.EISDIR
	case unix.S_IFCHR:
		if !devOK {
			return errNotRegular
		}
	default:
		return errNotRegular
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err == nil {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl&^unix.O_NONBLOCK)
	}
	return err
}

// openAppend opens p for appending, creating it with mode if missing
// (following ordinary symlinks, as `>>` would). Only regular files are
// written.
func (b *boxFS) openAppend(p string, mode uint32) (*os.File, error) {
	fd, err := b.resolve(p, unix.O_WRONLY|unix.O_APPEND|unix.O_CREAT|unix.O_NONBLOCK|unix.O_NOCTTY, mode)
	if errors.Is(err, unix.ENXIO) {
		return nil, errNotRegular // a FIFO without reader, or a socket
	}
	if err != nil {
		return nil, err
	}
	if err := blockingRegular(fd, false); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), p), nil
}

// openDir opens the directory p for listing (following ordinary symlinks).
func (b *boxFS) openDir(p string) (int, error) {
	return b.resolve(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
}

// lstat describes p itself (a final symlink as a symlink).
func (b *boxFS) lstat(p string) (*unix.Stat_t, error) {
	var st unix.Stat_t
	if p == "/" {
		return &st, unix.Fstat(b.root, &st)
	}
	pfd, name, err := b.parent(p)
	if err != nil {
		return nil, err
	}
	defer unix.Close(pfd)
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, err
	}
	return &st, nil
}

// readlinkAt returns the target of the symlink name in dirfd.
func readlinkAt(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// readlink returns the target of the symlink p (never following it).
func (b *boxFS) readlink(p string) (string, error) {
	pfd, name, err := b.parent(p)
	if err != nil {
		return "", err
	}
	defer unix.Close(pfd)
	return readlinkAt(pfd, name)
}

// mkdir makes the directory p; its parent must exist.
func (b *boxFS) mkdir(p string, mode uint32) error {
	pfd, name, err := b.parent(p)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	return unix.Mkdirat(pfd, name, mode)
}

// mkdirAll makes p and its missing parents (like mkdir -p, following
// ordinary symlinks) and returns an O_PATH handle on it.
func (b *boxFS) mkdirAll(p string, mode uint32) (int, error) {
	fd, err := b.resolve(p, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err == nil || !errors.Is(err, unix.ENOENT) || p == "/" {
		return fd, err
	}
	dir, name := path.Split(p)
	pfd, err := b.mkdirAll(path.Clean(dir), mode)
	if err != nil {
		return -1, err
	}
	err = unix.Mkdirat(pfd, name, mode)
	unix.Close(pfd)
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, err
	}
	return b.resolve(p, unix.O_PATH|unix.O_DIRECTORY, 0)
}

// remove removes the file, symlink or empty directory p itself, or with
// all it holds if recursive (never following a symlink below it).
func (b *boxFS) remove(p string, recursive bool) error {
	pfd, name, err := b.parent(p)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if recursive {
		return safepath.RemoveAllAt(pfd, name)
	}
	err = unix.Unlinkat(pfd, name, 0)
	if err == unix.EISDIR || err == unix.EPERM && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		err = unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR)
	}
	return err
}

// rename moves from to to (neither final component is followed).
func (b *boxFS) rename(from, to string) error {
	ofd, oname, err := b.parent(from)
	if err != nil {
		return err
	}
	defer unix.Close(ofd)
	nfd, nname, err := b.parent(to)
	if err != nil {
		return err
	}
	defer unix.Close(nfd)
	return unix.Renameat(ofd, oname, nfd, nname)
}

// readNames lists the open directory fd, sorted (the fd is not consumed).
func readNames(fd int) ([]string, error) {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "dir")
	names, err := f.Readdirnames(-1)
	f.Close()
	slices.Sort(names)
	return names, err
}

// walkFunc is called by walk for each entry: parent is the handle of the
// directory holding it, rel its slash path below the walked directory.
// Returning fs.SkipDir from a directory does not enter it.
type walkFunc func(parent int, rel, name string, st *unix.Stat_t) error

// walk calls fn for every entry below the open directory dirfd, parents
// before children, names sorted. Directories are entered through their
// parent's handle (never through a symlink); unreadable ones are listed
// but not entered; the agent's own /proc/<pid> directories are left out.
func (b *boxFS) walk(dirfd int, fn walkFunc) error {
	var st unix.Stat_t
	if err := unix.Fstat(dirfd, &st); err != nil {
		return err
	}
	return b.walkFd(dirfd, "", b.isProcRoot(&st), fn)
}

func (b *boxFS) isProcRoot(st *unix.Stat_t) bool {
	return b.procDev != 0 && st.Dev == b.procDev && st.Ino == procRootIno && st.Mode&unix.S_IFMT == unix.S_IFDIR
}

func (b *boxFS) walkFd(fd int, prefix string, inProcRoot bool, fn walkFunc) error {
	names, err := readNames(fd)
	if err != nil {
		return nil // unreadable: list what we can
	}
	for _, n := range names {
		if inProcRoot && isAgentTask(n) {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // removed since listed
		}
		rel := prefix + n
		err := fn(fd, rel, n, &st)
		if err == fs.SkipDir {
			continue
		}
		if err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		cfd, err := openat2(fd, n, unix.O_RDONLY|unix.O_DIRECTORY, 0, beneath)
		if err != nil {
			continue // unreadable, or replaced since listed
		}
		err = b.walkFd(cfd, rel+"/", b.isProcRoot(&st), fn)
		unix.Close(cfd)
		if err != nil {
			return err
		}
	}
	return nil
}

// openBeneath opens name in the directory dirfd for reading, never
// following a symlink, and checks it is (still) a regular file.
func openBeneath(dirfd int, name string) (*os.File, error) {
	fd, err := openat2(dirfd, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0, beneath)
	if err != nil {
		return nil, err
	}
	if err := blockingRegular(fd, false); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// ensureDir makes p and its missing parents (see mkdirAll).
func (b *boxFS) ensureDir(p string, mode uint32) error {
	fd, err := b.mkdirAll(p, mode)
	if err == nil {
		unix.Close(fd)
	}
	return err
}
