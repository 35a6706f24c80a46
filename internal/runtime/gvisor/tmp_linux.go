//go:build linux

//sbx:hostile-tree

package gvisor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/sbxdev/sbx/internal/safepath"
)

// boxTmp returns the host directory bound at the box's /tmp. runsc mounts a
// tmpfs of its own over an empty /tmp, in the sandbox's memory and outside
// the disk limit, unless the spec mounts something there; so the driver
// binds the rootfs overlay's own /tmp over it: the image's /tmp shows, and
// what the box writes there lands in the writable layer (its disk limit,
// its snapshots), as under oci. The rootfs holds the image's files: an
// image without a /tmp directory gets one, and one whose /tmp is something
// else (a symlink runsc would resolve on the host, anywhere, as the bind's
// source, and inside the box as its destination) has it replaced by an
// empty directory in the writable layer (a whiteout hides the image's).
func boxTmp(rootfs string, root int) (string, error) {
	r, err := safepath.OpenRoot(rootfs)
	if err != nil {
		return "", fmt.Errorf("open rootfs: %w", err)
	}
	defer r.Close()
	fi, err := r.Lstat("tmp")
	switch {
	case err == nil && fi.IsDir():
		return filepath.Join(rootfs, "tmp"), nil
	case err == nil:
		if err := r.Remove("tmp"); err != nil {
			return "", fmt.Errorf("replace the image's /tmp (%s): %w", fi.Mode().Type(), err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("stat /tmp in the rootfs: %w", err)
	}
	if err := r.Mkdir("tmp", 0o777); err != nil {
		return "", fmt.Errorf("create /tmp in the rootfs: %w", err)
	}
	if err := r.Lchown("tmp", root, root); err != nil {
		return "", fmt.Errorf("chown /tmp in the rootfs: %w", err)
	}
	if err := r.Chmod("tmp", os.ModeSticky|0o777); err != nil {
		return "", fmt.Errorf("chmod /tmp in the rootfs: %w", err)
	}
	return filepath.Join(rootfs, "tmp"), nil
}
