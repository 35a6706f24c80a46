// Package overlay mounts overlayfs stacks whose layers are named to the
// kernel by file descriptor (/proc/self/fd/N of O_PATH handles), not by
// path: overlayfs shows its options as given in every mountinfo that lists
// the mount, a sandbox's own included, and host paths there would tell a
// box the daemon's data dir and its id. Used by the oci driver (box root
// filesystems) and internal/codebase (codebase layers). Leaf: x/sys only.
package overlay

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Mount stacks lowers (lowest first) under upper (with its work dir) at
// target, with extra options appended (e.g. "redirect_dir=off") and mount
// flags.
func Mount(target string, lowers []string, upper, work, extra string, flags uintptr) error {
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	name := func(dir string) (string, error) {
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", fmt.Errorf("open overlay layer %s: %w", dir, err)
		}
		fds = append(fds, fd)
		return "/proc/self/fd/" + strconv.Itoa(fd), nil
	}
	rev := make([]string, len(lowers))
	for i, l := range lowers {
		n, err := name(l)
		if err != nil {
			return err
		}
		rev[len(lowers)-1-i] = n // overlayfs wants the top layer first
	}
	u, err := name(upper)
	if err != nil {
		return err
	}
	w, err := name(work)
	if err != nil {
		return err
	}
	opts := "lowerdir=" + strings.Join(rev, ":") + ",upperdir=" + u + ",workdir=" + w
	if extra != "" {
		opts += "," + extra
	}
	if len(opts) >= os.Getpagesize() {
		return fmt.Errorf("overlay mount options too long (%d bytes, %d layers)", len(opts), len(lowers))
	}
	if err := unix.Mount("overlay", target, "overlay", flags, opts); err != nil {
		return fmt.Errorf("mount overlay at %s: %w", target, err)
	}
	return nil
}
