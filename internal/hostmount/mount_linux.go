package hostmount

import (
	"errors"
	"fmt"
	"strconv"

	"golang.org/x/sys/unix"
)

// Tmpfs mounts a tmpfs of at most size bytes (0: the kernel's default) at
// dir, nosuid and nodev.
func Tmpfs(dir string, size int64) error {
	opts := "mode=0755"
	if size > 0 {
		opts += ",size=" + strconv.FormatInt(size, 10)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount tmpfs at %s: %w", dir, err)
	}
	return nil
}

// Unmount detaches the mount at dir; not mounted or missing is fine. A busy
// mount is lazily detached.
func Unmount(dir string) error {
	err := unix.Unmount(dir, 0)
	switch {
	case err == nil, errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.EBUSY):
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
		return nil
	}
	return fmt.Errorf("unmount %s: %w", dir, err)
}
