package oci

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/pidwatch"
)

// setSubreaper makes this process adopt orphaned descendants (see package doc).
func setSubreaper() error {
	return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}

// diskUsed is the space used on the filesystem at dir.
func diskUsed(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize, nil
}

// procStartTime is field 22 of /proc/pid/stat (0 if gone): with the pid it
// identifies a process across pid reuse.
func procStartTime(pid int) uint64 { return pidwatch.StartTime(pid) }

// reap waits for pid to exit and reaps it if it is our child (we are a
// subreaper). It never waits for any other process.
func reap(pid int, timeout time.Duration) error { return pidwatch.Reap(pid, timeout) }

// mkdirInRoot creates dir (absolute inside root) and its missing parents,
// resolving every component inside root so symlinks cannot lead out of it.
func mkdirInRoot(root, dir string, uid, gid int) error {
	rel := strings.Trim(filepath.Clean("/"+dir), "/")
	if rel == "" {
		return nil
	}
	rootfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open rootfs: %w", err)
	}
	defer unix.Close(rootfd)
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS}
	cur := "."
	for _, c := range strings.Split(rel, "/") {
		next := filepath.Join(cur, c)
		fd, err := unix.Openat2(rootfd, next, how)
		if err == nil {
			unix.Close(fd)
			cur = next
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("mkdir %s in rootfs: %w", dir, err)
		}
		parent, err := unix.Openat2(rootfd, cur, how)
		if err != nil {
			return fmt.Errorf("mkdir %s in rootfs: %w", dir, err)
		}
		err = unix.Mkdirat(parent, c, 0o755)
		if err == nil {
			err = unix.Fchownat(parent, c, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
		}
		unix.Close(parent)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("mkdir %s in rootfs: %w", dir, err)
		}
		cur = next
	}
	return nil
}

// writeFileInRoot creates or truncates file (a path inside root) and writes
// data, resolving the path inside root so an image's symlinks (an absolute
// /etc -> /host/etc, say) can never make us write a host file.
func writeFileInRoot(root, file string, data []byte, uid, gid int) error {
	rootfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open rootfs: %w", err)
	}
	defer unix.Close(rootfd)
	fd, err := unix.Openat2(rootfd, file, &unix.OpenHow{
		Flags:   unix.O_WRONLY | unix.O_CREAT | unix.O_TRUNC | unix.O_CLOEXEC,
		Mode:    0o644,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return fmt.Errorf("write /%s in rootfs: %w", file, err)
	}
	f := os.NewFile(uintptr(fd), file)
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write /%s in rootfs: %w", file, err)
	}
	if err := f.Chown(uid, gid); err != nil {
		return fmt.Errorf("chown /%s in rootfs: %w", file, err)
	}
	return nil
}

// fuseDevDir is the tmpfs, in a box dir, that holds the box's own /dev/fuse.
func fuseDevDir(box string) string { return filepath.Join(box, "dev") }

// makeFuseDevice gives one box a /dev/fuse node of its own: a char 10:229
// node, mode 0600, owned by the box's root (root: the first host uid of the
// box's own range), so the agent, root of the box's user namespace, can open
// it whatever the host's /dev/fuse mode; alone on a tiny tmpfs mounted at fuseDevDir(box) and bind-mounted at /dev/fuse.
// Box root may chmod, chown or touch it: that changes this box's node and
// nothing another box or the host sees (the host's /dev/fuse is never
// bound), and it goes with the box. Its own tmpfs, rather than a file in the
// box dir, so that the bind's root in the box's mountinfo is "/fuse" and
// not a host path; the tmpfs is mounted without nodev (the node must open)
// and 0700 for the box's root, so no host user can reach the node. Only
// the agent uses it: mounting needs CAP_SYS_ADMIN, which it drops before
// user code runs.
func makeFuseDevice(box string, root uint32) (string, error) {
	dir := fuseDevDir(box)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", fmt.Errorf("create fuse device dir: %w", err)
	}
	opts := fmt.Sprintf("mode=0700,uid=%d,gid=%d,size=4k,nr_inodes=4", root, root)
	if err := unix.Mount("sbx", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, opts); err != nil {
		return "", fmt.Errorf("mount fuse device dir: %w", err)
	}
	node := filepath.Join(dir, "fuse")
	if err := unix.Mknod(node, unix.S_IFCHR|0o600, int(unix.Mkdev(10, 229))); err != nil {
		return "", fmt.Errorf("mknod %s: %w", node, err)
	}
	if err := unix.Lchown(node, int(root), int(root)); err != nil {
		return "", fmt.Errorf("chown %s: %w", node, err)
	}
	return node, nil
}

// hostHasFuse reports whether the kernel offers FUSE (path policies need it).
func hostHasFuse() bool {
	var st unix.Stat_t
	if unix.Stat("/dev/fuse", &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == unix.Mkdev(10, 229) {
		return true
	}
	b, err := os.ReadFile("/proc/filesystems")
	return err == nil && strings.Contains(string(b), "\tfuse\n")
}
