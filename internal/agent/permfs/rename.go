//go:build linux

package permfs

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/permrules"
)

// maxRenameWalk bounds the entries a directory rename checks; a bigger tree
// gets EXDEV and mv copies it file by file, each file checked.
const maxRenameWalk = 10000

// Rename needs WRITE on the source and the destination, and a directory
// moves only if everything below it keeps its permission at the new place.
func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	if flags&^uint32(unix.RENAME_NOREPLACE|unix.RENAME_EXCHANGE) != 0 {
		return syscall.EINVAL
	}
	srcDir, ok1 := n.rel()
	dstDir, ok2 := np.rel()
	if !ok1 || !ok2 || !validName(name) || !validName(newName) {
		return syscall.ENOENT
	}
	src, dst := join(srcDir, name), join(dstDir, newName)
	sdfd, err := n.g.openDir(srcDir)
	if err != nil {
		return errno(err)
	}
	defer unix.Close(sdfd)
	ddfd, err := n.g.openDir(dstDir)
	if err != nil {
		return errno(err)
	}
	defer unix.Close(ddfd)

	var sst unix.Stat_t
	if err := unix.Fstatat(sdfd, name, &sst, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return errno(err)
	}
	srcIsDir := sst.Mode&unix.S_IFMT == unix.S_IFDIR
	if e := n.g.canMove(sdfd, name, src, dst, srcIsDir); e != 0 {
		return e
	}
	var dst_ unix.Stat_t
	dstExists := unix.Fstatat(ddfd, newName, &dst_, unix.AT_SYMLINK_NOFOLLOW) == nil
	if dstExists {
		dstIsDir := dst_.Mode&unix.S_IFMT == unix.S_IFDIR
		// The replaced (or, with RENAME_EXCHANGE, moved) entry must be ours
		// to change too.
		if n.g.decide(dst, dstIsDir) != permrules.Write {
			return syscall.EACCES
		}
		if flags&unix.RENAME_EXCHANGE != 0 {
			if e := n.g.canMove(ddfd, newName, dst, src, dstIsDir); e != 0 {
				return e
			}
		}
	}
	if dstExists && flags&unix.RENAME_EXCHANGE == 0 {
		np.pinBeforeRemove(ddfd, newName)
	}
	return errno(unix.Renameat2(sdfd, name, ddfd, newName, uint(flags)))
}

// canMove checks moving the entry name of directory dfd from path from to
// path to.
func (g *guardFS) canMove(dfd int, name, from, to string, isDir bool) syscall.Errno {
	if g.decide(from, isDir) != permrules.Write || g.decide(to, isDir) != permrules.Write {
		return syscall.EACCES
	}
	if !isDir {
		return 0
	}
	fd, err := unix.Openat2(dfd, name, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return errno(err)
	}
	budget := maxRenameWalk
	return g.walkSame(fd, from, to, &budget)
}

// walkSame checks (and closes) the directory fd, at path from, moving to
// path to: every entry below must keep its permission at its new path.
func (g *guardFS) walkSame(fd int, from, to string, budget *int) syscall.Errno {
	defer unix.Close(fd)
	ents, err := readDirFd(fd)
	if err != nil {
		return errno(err)
	}
	for _, de := range ents {
		*budget--
		if *budget < 0 {
			return syscall.EXDEV
		}
		isDir := de.Mode == unix.S_IFDIR
		if de.Mode == 0 {
			var st unix.Stat_t
			if err := unix.Fstatat(fd, de.Name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return errno(err)
			}
			isDir = st.Mode&unix.S_IFMT == unix.S_IFDIR
		}
		f, t := join(from, de.Name), join(to, de.Name)
		// Equal, not just no more permissive: the kernel caches what a
		// file's permission lets it open (see fillAttr), so the permission
		// of a file it knows must never change.
		if g.decide(t, isDir) != g.decide(f, isDir) {
			return syscall.EXDEV
		}
		if isDir {
			cfd, err := unix.Openat2(fd, de.Name, &unix.OpenHow{
				Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
				Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
			})
			if err != nil {
				return errno(err)
			}
			if e := g.walkSame(cfd, f, t, budget); e != 0 {
				return e
			}
		}
	}
	return 0
}
