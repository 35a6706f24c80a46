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

// File data. With OPEN off there are no file handles: the kernel sends
// reads (page cache misses only: data is cached, keep_cache) and writes for
// the inode, and they are served on the node's current path, opened for
// the one call. A file unlinked (or renamed over) while the kernel still
// knows it gets an fd pinned before the unlink, so processes that hold it
// open keep reading and writing it; the pin is closed when the kernel
// forgets the inode.

var (
	_ fs.NodeReader      = (*node)(nil)
	_ fs.NodeWriter      = (*node)(nil)
	_ fs.NodeFsyncer     = (*node)(nil)
	_ fs.NodeAllocater   = (*node)(nil)
	_ fs.NodeOnForgetter = (*node)(nil)
)

// orphanFd is the pinned fd of an unlinked file, or -1.
func (n *node) orphanFd() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.orphan == 0 {
		return -1
	}
	return n.orphan - 1
}

// pinBeforeRemove pins an fd on the node of entry name of the directory dfd
// (if the kernel knows it and it is a regular file) before it is unlinked
// or replaced.
func (n *node) pinBeforeRemove(dfd int, name string) {
	ch := n.GetChild(name)
	if ch == nil || ch.StableAttr().Mode != unix.S_IFREG {
		return
	}
	cn, ok := ch.Operations().(*node)
	if !ok {
		return
	}
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.orphan != 0 {
		return
	}
	fd, err := unix.Openat(dfd, name, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return
	}
	cn.orphan = fd + 1
}

// OnForget closes the pinned fd and forgets the node's links.
func (n *node) OnForget() {
	n.mu.Lock()
	if n.orphan != 0 {
		unix.Close(n.orphan - 1)
		n.orphan = 0
	}
	id := n.file
	n.mu.Unlock()
	n.g.links.remove(n, id)
}

// io runs fn on an fd of the node's file opened with flags (O_RDONLY or
// O_WRONLY): the pinned fd of an unlinked file, else the file at its path,
// which must have at least perm.
func (n *node) io(flags int, perm permrules.Perm, fn func(fd int) syscall.Errno) syscall.Errno {
	rel, ok := n.rel()
	if !ok {
		fd := n.orphanFd()
		if fd < 0 {
			return syscall.EIO
		}
		return fn(fd)
	}
	if n.g.decide(rel, false) < perm {
		return syscall.EACCES
	}
	fd, err := n.g.openRel(rel, flags|unix.O_NONBLOCK, 0)
	if err != nil {
		return errno(err)
	}
	defer unix.Close(fd)
	return fn(fd)
}

func (n *node) Read(ctx context.Context, f fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	var k int
	e := n.io(unix.O_RDONLY, permrules.Read, func(fd int) syscall.Errno {
		var err error
		k, err = unix.Pread(fd, dest, off)
		return errno(err)
	})
	if e != 0 {
		return nil, e
	}
	return fuse.ReadResultData(dest[:k]), 0
}

func (n *node) Write(ctx context.Context, f fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	var k int
	e := n.io(unix.O_WRONLY, permrules.Write, func(fd int) syscall.Errno {
		var err error
		k, err = unix.Pwrite(fd, data, off)
		return errno(err)
	})
	if k > 0 {
		n.g.links.changed(n)
	}
	return uint32(max(k, 0)), e
}

func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	return n.io(unix.O_RDONLY, permrules.Read, func(fd int) syscall.Errno { return errno(unix.Fsync(fd)) })
}

func (n *node) Allocate(ctx context.Context, f fs.FileHandle, off uint64, size uint64, mode uint32) syscall.Errno {
	e := n.io(unix.O_WRONLY, permrules.Write, func(fd int) syscall.Errno {
		return errno(unix.Fallocate(fd, mode, int64(off), int64(size)))
	})
	n.g.links.changed(n)
	return e
}
