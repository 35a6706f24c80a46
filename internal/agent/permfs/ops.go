//go:build linux

package permfs

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/permrules"
)

var (
	_ fs.NodeLookuper   = (*node)(nil)
	_ fs.NodeGetattrer  = (*node)(nil)
	_ fs.NodeSetattrer  = (*node)(nil)
	_ fs.NodeOpener     = (*node)(nil)
	_ fs.NodeCreater    = (*node)(nil)
	_ fs.NodeReaddirer  = (*node)(nil)
	_ fs.NodeOpendirer  = (*node)(nil)
	_ fs.NodeMkdirer    = (*node)(nil)
	_ fs.NodeMknoder    = (*node)(nil)
	_ fs.NodeSymlinker  = (*node)(nil)
	_ fs.NodeLinker     = (*node)(nil)
	_ fs.NodeReadlinker = (*node)(nil)
	_ fs.NodeUnlinker   = (*node)(nil)
	_ fs.NodeRmdirer    = (*node)(nil)
	_ fs.NodeRenamer    = (*node)(nil)
	_ fs.NodeStatfser   = (*node)(nil)
	_ fs.NodeFlusher    = (*node)(nil)
)

// newChild makes the node of a looked-up or created entry.
func (n *node) newChild(ctx context.Context, st *unix.Stat_t, perm permrules.Perm, out *fuse.EntryOut) *fs.Inode {
	fillAttr(&out.Attr, st, perm)
	sa := stableAttr(st)
	out.Attr.Ino = sa.Ino
	child := &node{g: n.g}
	in := n.NewInode(ctx, child, sa)
	if cn, ok := in.Operations().(*node); ok {
		n.g.links.add(cn, st)
	}
	return in
}

// Lookup hides NONE paths.
func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	dir, ok := n.rel()
	if !ok || !validName(name) {
		return nil, syscall.ENOENT
	}
	var st unix.Stat_t
	if err := n.g.lstatAt(dir, name, &st); err != nil {
		return nil, errno(err)
	}
	perm := n.g.decide(join(dir, name), st.Mode&unix.S_IFMT == unix.S_IFDIR)
	if perm == permrules.None {
		return nil, syscall.ENOENT
	}
	return n.newChild(ctx, &st, perm, out), 0
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	var st unix.Stat_t
	rel, ok := n.rel()
	if !ok {
		fd := n.orphanFd()
		if fd < 0 {
			return syscall.ENOENT
		}
		if err := unix.Fstat(fd, &st); err != nil {
			return errno(err)
		}
		fillAttr(&out.Attr, &st, permrules.Write)
		return 0
	}
	if err := n.g.lstat(rel, &st); err != nil {
		return errno(err)
	}
	fillAttr(&out.Attr, &st, n.g.decide(rel, st.Mode&unix.S_IFMT == unix.S_IFDIR))
	return 0
}

// needWrite returns the node's path if it may be changed.
func (n *node) needWrite() (string, syscall.Errno) {
	rel, ok := n.rel()
	if !ok {
		return "", syscall.ENOENT
	}
	if n.g.decide(rel, n.IsDir()) != permrules.Write {
		return "", syscall.EACCES
	}
	return rel, 0
}

// Setattr (chmod, chown, truncate, utimes) needs WRITE.
func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	rel, e := n.needWrite()
	fd := -1
	if e == syscall.ENOENT {
		// An unlinked file still open somewhere keeps working on its fd.
		if fd = n.orphanFd(); fd < 0 {
			return e
		}
	} else if e != 0 {
		return e
	}
	if fd < 0 {
		pfd, err := n.g.openRel(rel, unix.O_PATH, 0)
		if err != nil {
			return errno(err)
		}
		defer unix.Close(pfd)
		fd = pfd
	}
	p := procFd(fd)
	if m, ok := in.GetMode(); ok {
		if n.StableAttr().Mode == unix.S_IFLNK {
			return syscall.EOPNOTSUPP
		}
		if err := unix.Chmod(p, m&07777); err != nil {
			return errno(err)
		}
	}
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	if uok || gok {
		u, g := -1, -1
		if uok {
			u = int(uid)
		}
		if gok {
			g = int(gid)
		}
		if err := unix.Fchownat(fd, "", u, g, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return errno(err)
		}
	}
	if sz, ok := in.GetSize(); ok {
		if err := unix.Truncate(p, int64(sz)); err != nil {
			return errno(err)
		}
	}
	mtime, mok := in.GetMTime()
	atime, aok := in.GetATime()
	if mok || aok {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		if aok {
			ts[0] = unix.NsecToTimespec(atime.UnixNano())
		}
		if mok {
			ts[1] = unix.NsecToTimespec(mtime.UnixNano())
		}
		if in.Valid&fuse.FATTR_ATIME_NOW != 0 {
			ts[0] = unix.Timespec{Nsec: unix.UTIME_NOW}
		}
		if in.Valid&fuse.FATTR_MTIME_NOW != 0 {
			ts[1] = unix.Timespec{Nsec: unix.UTIME_NOW}
		}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, 0); err != nil {
			return errno(err)
		}
	}
	n.g.links.changed(n)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return errno(err)
	}
	fillAttr(&out.Attr, &st, permrules.Write)
	return 0
}

// Open is not served: ENOSYS makes the kernel stop sending OPEN (and
// RELEASE) for the whole mount, so an open costs no round trip. The kernel
// enforces it instead, from the attributes (see fillAttr): READ and VIEW
// files cannot be opened for writing, VIEW files not at all, by anyone.
// Reads and writes come with no handle and are served by path (node.io).
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return nil, 0, syscall.ENOSYS
}

// Flush is not needed (writes are not cached): ENOSYS turns it off for the
// whole mount, which saves a round trip on every close.
func (n *node) Flush(ctx context.Context, f fs.FileHandle) syscall.Errno {
	return syscall.ENOSYS
}

// childWritable returns the path of name in n if a new entry may be made
// there.
func (n *node) childWritable(name string, isDir bool) (string, syscall.Errno) {
	dir, ok := n.rel()
	if !ok {
		return "", syscall.ENOENT
	}
	if !validName(name) {
		return "", syscall.EINVAL
	}
	rel := join(dir, name)
	if n.g.decide(rel, isDir) != permrules.Write {
		return "", syscall.EACCES
	}
	return rel, 0
}

// chownToCaller gives a new entry to the process that made it, as the
// kernel would have.
func chownToCaller(ctx context.Context, dirfd int, name string) {
	if uid, gid, ok := caller(ctx); ok && (uid != 0 || gid != 0) {
		unix.Fchownat(dirfd, name, int(uid), int(gid), unix.AT_SYMLINK_NOFOLLOW)
	}
}

// parentFd opens the node (a directory) beneath the root, for *at calls on
// its entries, and returns its path.
func (n *node) parentFd() (int, string, syscall.Errno) {
	dir, ok := n.rel()
	if !ok {
		return -1, "", syscall.ENOENT
	}
	fd, err := n.g.openDir(dir)
	if err != nil {
		return -1, "", errno(err)
	}
	return fd, dir, 0
}

// Create is not served either (ENOSYS: the kernel makes files with MKNOD
// and, with OPEN off, opens them itself).
func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.ENOSYS
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if _, e := n.childWritable(name, true); e != 0 {
		return nil, e
	}
	return n.makeEntry(ctx, name, func(dfd int) error { return unix.Mkdirat(dfd, name, mode) }, out)
}

func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if _, e := n.childWritable(name, false); e != 0 {
		return nil, e
	}
	return n.makeEntry(ctx, name, func(dfd int) error { return unix.Mknodat(dfd, name, mode, int(dev)) }, out)
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if _, e := n.childWritable(name, false); e != 0 {
		return nil, e
	}
	return n.makeEntry(ctx, name, func(dfd int) error { return unix.Symlinkat(target, dfd, name) }, out)
}

// makeEntry runs mk in n's backing directory and returns the new entry.
func (n *node) makeEntry(ctx context.Context, name string, mk func(dfd int) error, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	dfd, _, e := n.parentFd()
	if e != 0 {
		return nil, e
	}
	defer unix.Close(dfd)
	if err := mk(dfd); err != nil {
		return nil, errno(err)
	}
	chownToCaller(ctx, dfd, name)
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, errno(err)
	}
	return n.newChild(ctx, &st, permrules.Write, out), 0
}

// Link needs WRITE on the existing file and on the new name: a file that is
// read-only or hidden cannot get a writable (or any) second name.
func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	tn, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	trel, e := tn.needWrite()
	if e != 0 {
		return nil, e
	}
	if _, e := n.childWritable(name, false); e != 0 {
		return nil, e
	}
	tdfd, tname, e := tn.parentAndName(trel)
	if e != 0 {
		return nil, e
	}
	defer unix.Close(tdfd)
	dfd, _, e := n.parentFd()
	if e != 0 {
		return nil, e
	}
	defer unix.Close(dfd)
	if err := unix.Linkat(tdfd, tname, dfd, name, 0); err != nil {
		return nil, errno(err)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, errno(err)
	}
	n.g.links.add(tn, &st)
	return n.newChild(ctx, &st, permrules.Write, out), 0
}

// parentAndName opens rel's parent directory and returns rel's base name.
func (n *node) parentAndName(rel string) (int, string, syscall.Errno) {
	i := len(rel) - 1
	for i >= 0 && rel[i] != '/' {
		i--
	}
	dir := rel[:i]
	if dir == "" {
		dir = "/"
	}
	fd, err := n.g.openDir(dir)
	if err != nil {
		return -1, "", errno(err)
	}
	return fd, rel[i+1:], 0
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	rel, ok := n.rel()
	if !ok {
		return nil, syscall.ENOENT
	}
	dfd, name, e := n.parentAndName(rel)
	if e != 0 {
		return nil, e
	}
	defer unix.Close(dfd)
	buf := make([]byte, 4096)
	k, err := unix.Readlinkat(dfd, name, buf)
	if err != nil {
		return nil, errno(err)
	}
	return buf[:k], 0
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	return n.remove(name, false)
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	return n.remove(name, true)
}

func (n *node) remove(name string, isDir bool) syscall.Errno {
	if _, e := n.childWritable(name, isDir); e != 0 {
		return e
	}
	dfd, _, e := n.parentFd()
	if e != 0 {
		return e
	}
	defer unix.Close(dfd)
	flags := 0
	if isDir {
		flags = unix.AT_REMOVEDIR
	} else {
		n.pinBeforeRemove(dfd, name)
	}
	return errno(unix.Unlinkat(dfd, name, flags))
}

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	var st unix.Statfs_t
	if err := unix.Fstatfs(n.g.rootFd, &st); err != nil {
		return errno(err)
	}
	out.Blocks, out.Bfree, out.Bavail = st.Blocks, st.Bfree, st.Bavail
	out.Files, out.Ffree = st.Files, st.Ffree
	out.Bsize, out.NameLen, out.Frsize = uint32(st.Bsize), uint32(st.Namelen), uint32(st.Frsize)
	return 0
}

// Opendir: listing needs VIEW (hidden directories never get here).
func (n *node) Opendir(ctx context.Context) syscall.Errno {
	rel, ok := n.rel()
	if !ok {
		return syscall.ENOENT
	}
	if n.g.decide(rel, true) < permrules.View {
		return syscall.EACCES
	}
	return 0
}

// Readdir lists the backing directory without its NONE entries.
func (n *node) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	rel, ok := n.rel()
	if !ok {
		return nil, syscall.ENOENT
	}
	fd, err := n.g.openRel(rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, errno(err)
	}
	defer unix.Close(fd)
	ents, err := readDirFd(fd)
	if err != nil {
		return nil, errno(err)
	}
	out := ents[:0]
	for _, de := range ents {
		isDir := de.Mode == unix.S_IFDIR
		if de.Mode == 0 { // DT_UNKNOWN
			var st unix.Stat_t
			if unix.Fstatat(fd, de.Name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
				continue
			}
			de.Mode = st.Mode & unix.S_IFMT
			isDir = de.Mode == unix.S_IFDIR
		}
		if n.g.decide(join(rel, de.Name), isDir) == permrules.None {
			continue
		}
		out = append(out, de)
	}
	return fs.NewListDirStream(out), 0
}

// readDirFd reads every entry of the open directory fd but "." and "..".
func readDirFd(fd int) ([]fuse.DirEntry, error) {
	var out []fuse.DirEntry
	buf := make([]byte, 32<<10)
	for {
		k, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if k <= 0 {
			return out, nil
		}
		b := buf[:k]
		for len(b) >= 19 {
			reclen := int(b[16]) | int(b[17])<<8
			if reclen < 19 || reclen > len(b) {
				break
			}
			ino := uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
				uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
			typ := b[18]
			nameb := b[19:reclen]
			for i, c := range nameb {
				if c == 0 {
					nameb = nameb[:i]
					break
				}
			}
			name := string(nameb)
			b = b[reclen:]
			if name == "." || name == ".." {
				continue
			}
			out = append(out, fuse.DirEntry{Name: name, Ino: ino, Mode: dtToMode(typ)})
		}
	}
}

func dtToMode(t byte) uint32 {
	switch t {
	case unix.DT_REG:
		return unix.S_IFREG
	case unix.DT_DIR:
		return unix.S_IFDIR
	case unix.DT_LNK:
		return unix.S_IFLNK
	case unix.DT_FIFO:
		return unix.S_IFIFO
	case unix.DT_SOCK:
		return unix.S_IFSOCK
	case unix.DT_CHR:
		return unix.S_IFCHR
	case unix.DT_BLK:
		return unix.S_IFBLK
	}
	return 0
}
