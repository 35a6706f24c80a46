package image

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// mkWhiteout creates an overlayfs whiteout (char device 0:0) called name in
// dir, a directory inside root.
func mkWhiteout(root *os.Root, dir, name string, uid int) error {
	d, err := root.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	fd := int(d.Fd())
	if err := unix.Mknodat(fd, name, unix.S_IFCHR|0o600, 0); err != nil {
		return fmt.Errorf("create whiteout %s/%s: %w", dir, name, err)
	}
	if err := unix.Fchownat(fd, name, uid, uid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown whiteout %s/%s: %w", dir, name, err)
	}
	return nil
}

// setOpaque marks dir (inside root) as an opaque overlayfs directory.
func setOpaque(root *os.Root, dir string) error {
	d, err := root.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.Fsetxattr(int(d.Fd()), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		return fmt.Errorf("mark %s opaque: %w", dir, err)
	}
	return nil
}

// setFileTimes sets the access and modification times of an open file.
func setFileTimes(f *os.File, atime, mtime time.Time) error {
	tv := []unix.Timeval{timeval(atime), timeval(mtime)}
	if err := unix.Futimes(int(f.Fd()), tv); err != nil {
		return fmt.Errorf("set times of %s: %w", f.Name(), err)
	}
	return nil
}

// lockDir takes an exclusive, non-blocking lock on dir/lock, held until the
// returned file is closed: one store per directory.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(dir+"/lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("image store %s is in use by another process: %w", dir, err)
	}
	return f, nil
}

func timeval(t time.Time) unix.Timeval {
	return unix.Timeval{Sec: t.Unix(), Usec: int64(t.Nanosecond() / 1000)}
}
