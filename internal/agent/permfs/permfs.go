//go:build linux

// Package permfs is the agent's enforcement of path permission rules: a FUSE
// file system mounted over a guarded directory that serves the directory's
// previous contents, filtered through a permrules.Policy. It is part of
// sbx-agent (imported only by internal/agent).
//
// The agent opens the guarded directory (an O_PATH fd to whatever was mounted
// there), then mounts the FUSE file system over the same path. Every request
// is served relative to that fd with openat2(RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS) and *at calls on a name that
// never follow a final symlink, so nothing the sandbox does to the tree can
// make the agent leave the backing tree or follow a link inside it. Symlinks
// are returned as symlinks: the kernel resolves them through the mount again,
// so rules still apply to their targets.
//
// Decisions are made on the node's current path (rules are about paths):
// lookup of a NONE path fails with ENOENT and readdir leaves it out; every
// change (write, truncate, chmod, chown, utimes, mknod/create, mkdir,
// symlink, link, unlink, rmdir, rename) needs WRITE on every path it
// touches, else EACCES. Renaming a directory also needs every path below it
// to keep its permission at its new place (checked by walking it; big trees
// get EXDEV, and tools fall back to copying file by file), so the
// permission of a file the kernel knows never changes. Extended attributes
// are not supported (ENOTSUP: nothing can be set).
//
// Opens cost no round trip: OPEN (and CREATE) answer ENOSYS, which turns
// them off for the mount, and the kernel enforces open permissions itself
// from the attributes this layer reports (default_permissions): READ files
// lose their write bits, VIEW files all bits, and both are shown with an
// unmappable group, which stops root's capabilities from overriding mode
// bits (see fillAttr). The price: such files show the overflow group, their
// group bits apply to no one, root reads them only through their owner or
// other bits, and the kernel refuses unlink, rename, link, chmod and chown
// of them with EOVERFLOW before asking us. Reads and writes arrive without
// a file handle and are served by path (io.go). The kernel caches entries,
// attributes and file data: that is safe because every change to the
// backing tree goes through this layer.
package permfs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/permrules"
)

// cacheTimeout is how long the kernel may cache entries and attributes.
const cacheTimeout = time.Minute

// Guard is one mounted FUSE layer.
type Guard struct {
	// Path is the guarded directory.
	Path   string
	server *fuse.Server
	rootFd int
}

// Mount opens pol.Path (created if missing), mounts the permission layer
// over it and returns once the mount serves. It needs CAP_SYS_ADMIN (in the
// sandbox's user namespace) and /dev/fuse.
func Mount(pol *permrules.Policy, log *slog.Logger) (*Guard, error) {
	if err := os.MkdirAll(pol.Path, 0o755); err != nil {
		return nil, fmt.Errorf("creating guarded directory %s: %w", pol.Path, err)
	}
	fd, err := unix.Open(pol.Path, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening guarded directory %s: %w", pol.Path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("stat of guarded directory %s: %w", pol.Path, err)
	}
	g := &guardFS{pol: pol, rootFd: fd, log: log}
	root := &node{g: g}
	timeout := cacheTimeout
	opts := &fs.Options{
		MountOptions: fuse.MountOptions{
			AllowOther:        true,
			DirectMountStrict: true,
			FsName:            "sbx-guard",
			Name:              "sbxguard",
			// The kernel checks mode bits against the caller (non-root
			// sandbox users), as on any file system; we serve as root.
			Options:       []string{"default_permissions"},
			DisableXAttrs: true,
			MaxBackground: 64,
		},
		EntryTimeout:    &timeout,
		AttrTimeout:     &timeout,
		NegativeTimeout: &timeout,
		NullPermissions: true,
		RootStableAttr:  &fs.StableAttr{Ino: inoOf(&st)},
	}
	srv, err := fs.Mount(pol.Path, root, opts)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mounting permission layer on %s: %w", pol.Path, err)
	}
	return &Guard{Path: pol.Path, server: srv, rootFd: fd}, nil
}

// Unmount unmounts the layer (needs CAP_SYS_ADMIN) and closes the backing fd.
func (g *Guard) Unmount() error {
	err := g.server.Unmount()
	if err == nil {
		g.server.Wait()
		unix.Close(g.rootFd)
	}
	return err
}

// guardFS is the state shared by a mount's nodes.
type guardFS struct {
	pol    *permrules.Policy
	rootFd int
	log    *slog.Logger
	links  linkSet
}

// node is one file, directory or symlink of the guarded tree. It holds no
// fd: every operation resolves the node's current path beneath rootFd.
type node struct {
	fs.Inode
	g *guardFS

	// mu guards orphan and file. orphan is 1 + the fd pinned when the file
	// was unlinked while the kernel knew it (0: none; see io.go); file is
	// the backing file of a multiply linked file (zero: not; see links.go).
	mu     sync.Mutex
	orphan int
	file   fileID
}

// nextIno numbers inodes that must not share a kernel inode with another
// path (multiply linked files): each path gets its own node, so its
// permission is decided by that path.
var nextIno atomic.Uint64

func init() { nextIno.Store(1 << 62) }

func inoOf(st *unix.Stat_t) uint64 {
	swapped := (uint64(st.Dev) << 32) | (uint64(st.Dev) >> 32)
	return (swapped ^ st.Ino) &^ (1 << 63)
}

// stableAttr is the identity of a new node for st.
func stableAttr(st *unix.Stat_t) fs.StableAttr {
	mode := st.Mode & unix.S_IFMT
	if mode != unix.S_IFDIR && st.Nlink > 1 {
		return fs.StableAttr{Mode: mode, Ino: nextIno.Add(1)}
	}
	return fs.StableAttr{Mode: mode, Ino: inoOf(st)}
}

// rel returns the node's path relative to the guard ("/" for the root) and
// false if the node is no longer linked in the tree.
func (n *node) rel() (string, bool) {
	var segs []string
	var cur *fs.Inode = n.EmbeddedInode()
	for !cur.IsRoot() {
		name, parent := cur.Parent()
		if parent == nil {
			return "", false
		}
		segs = append(segs, name)
		cur = parent
	}
	var b strings.Builder
	for i := len(segs) - 1; i >= 0; i-- {
		b.WriteByte('/')
		b.WriteString(segs[i])
	}
	if b.Len() == 0 {
		return "/", true
	}
	return b.String(), true
}

func join(dir, name string) string {
	if dir == "/" {
		return "/" + name
	}
	return dir + "/" + name
}

// validName rejects names the kernel would never send but a broken caller
// might.
func validName(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, "/\x00")
}

// openRel opens rel beneath the root without following any symlink.
func (g *guardFS) openRel(rel string, flags int, mode uint32) (int, error) {
	p := strings.TrimPrefix(rel, "/")
	if p == "" {
		p = "."
	}
	for {
		fd, err := unix.Openat2(g.rootFd, p, &unix.OpenHow{
			Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW),
			Mode:    uint64(mode),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		return fd, err
	}
}

// openDir opens the directory rel (O_PATH).
func (g *guardFS) openDir(rel string) (int, error) {
	return g.openRel(rel, unix.O_PATH|unix.O_DIRECTORY, 0)
}

// decide is the permission of rel.
func (g *guardFS) decide(rel string, isDir bool) permrules.Perm {
	return g.pol.Decide(rel, isDir)
}

// lstatAt stats name in the directory dirRel.
func (g *guardFS) lstatAt(dirRel, name string, st *unix.Stat_t) error {
	dfd, err := g.openDir(dirRel)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	return unix.Fstatat(dfd, name, st, unix.AT_SYMLINK_NOFOLLOW)
}

// lstat stats rel itself.
func (g *guardFS) lstat(rel string, st *unix.Stat_t) error {
	if rel == "/" {
		return unix.Fstat(g.rootFd, st)
	}
	i := strings.LastIndexByte(rel, '/')
	dir := rel[:i]
	if dir == "" {
		dir = "/"
	}
	return g.lstatAt(dir, rel[i+1:], st)
}

// unmappedGID is (gid_t)-1, which no user namespace maps (not even the
// host's). A file shown with it has an owner group the kernel cannot map
// (INVALID_GID, shown as the overflow group, usually "nogroup"), and then no
// capability overrides its mode bits: not CAP_DAC_OVERRIDE,
// CAP_DAC_READ_SEARCH or CAP_FOWNER (capable_wrt_inode_uidgid needs both
// ids mapped). That is how root in the sandbox is kept from opening a READ
// file for writing or a VIEW file at all, with no OPEN round trip.
const unmappedGID = 0xffffffff

// fillAttr converts st for the kernel. Mode bits the permission forbids are
// masked; READ and VIEW files (not directories, not symlinks) get
// unmappedGID so the kernel enforces the masked bits on everyone. They keep
// their owner: the owner's bits still apply to the owner, the other bits to
// everyone else (root included), the group bits to no one.
func fillAttr(out *fuse.Attr, st *unix.Stat_t, perm permrules.Perm) {
	var sst syscall.Stat_t
	sst.Dev, sst.Ino, sst.Nlink, sst.Mode, sst.Uid, sst.Gid = st.Dev, st.Ino, st.Nlink, st.Mode, st.Uid, st.Gid
	sst.Rdev, sst.Size, sst.Blksize, sst.Blocks = st.Rdev, st.Size, st.Blksize, st.Blocks
	sst.Atim = syscall.Timespec{Sec: st.Atim.Sec, Nsec: st.Atim.Nsec}
	sst.Mtim = syscall.Timespec{Sec: st.Mtim.Sec, Nsec: st.Mtim.Nsec}
	sst.Ctim = syscall.Timespec{Sec: st.Ctim.Sec, Nsec: st.Ctim.Nsec}
	out.FromStat(&sst)
	typ := st.Mode & unix.S_IFMT
	isDir := typ == unix.S_IFDIR
	switch {
	case perm == permrules.Write:
	case perm == permrules.Read || isDir:
		out.Mode &^= 0o222
	default:
		out.Mode &^= 0o777
	}
	if perm != permrules.Write && !isDir && typ != unix.S_IFLNK {
		out.Gid = unmappedGID
	}
}

func errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		if e == unix.ELOOP || e == unix.EXDEV {
			// A symlink or a mount point in the way of a resolution that
			// must not follow it; the path is not there for us.
			return syscall.ENOENT
		}
		return e
	}
	return syscall.EIO
}

// caller returns the uid and gid of the process behind a request.
func caller(ctx context.Context) (uint32, uint32, bool) {
	if c, ok := ctx.(*fuse.Context); ok {
		return c.Caller.Uid, c.Caller.Gid, true
	}
	return 0, 0, false
}

// procFd is a path through which fd's inode can be changed with calls that
// do not take an O_PATH fd.
func procFd(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }
