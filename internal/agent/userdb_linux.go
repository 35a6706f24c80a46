package agent

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// openUserDB opens a passwd or group file of the sandbox for reading. Its
// path is the box's to make: plain symlinks are followed as libc would, but
// not magic links (/etc/passwd -> /proc/1/fd/N/... would read through the
// agent's own handles, which user code cannot), and the result must be a
// regular file (a FIFO would block the agent).
func openUserDB(path string) (*os.File, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil || sfs.Type == unix.PROC_SUPER_MAGIC {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: refusing a file in /proc", path)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}
