package codebase

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/hostmount"
	"github.com/sbxdev/sbx/internal/runtime"
)

// mountLayer makes dir/rw (a tmpfs of size bytes holding upper/ and work/)
// and returns the overlay of lower under it for the box's driver to mount:
// the driver shows both through idmapped mounts in the box's own id range
// (an overlay mount itself cannot be idmapped). upper and work are owned by
// sandbox root in the canonical range (rootUID), as the tree is. On failure
// nothing is left.
func mountLayer(lower, dir string, size int64, rootUID int) (ov *runtime.CodebaseMount, err error) {
	for _, p := range []string{lower, dir} {
		if strings.ContainsAny(p, ",:") {
			return nil, fmt.Errorf("path %q contains ',' or ':' (unusable in overlay options)", p)
		}
	}
	rw := filepath.Join(dir, "rw")
	if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
		return nil, fmt.Errorf("create mount dir: %w", err)
	}
	if err := os.Mkdir(dir, 0o711); err != nil {
		return nil, fmt.Errorf("create mount dir: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = unmountLayer(dir)
		}
	}()
	if err := os.Mkdir(rw, 0o711); err != nil {
		return nil, fmt.Errorf("create mount dir: %w", err)
	}
	opts := "mode=0700"
	if size > 0 {
		opts += ",size=" + strconv.FormatInt(size, 10)
	}
	if err := unix.Mount("tmpfs", rw, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return nil, fmt.Errorf("mount tmpfs at %s: %w", rw, err)
	}
	// Owned by sandbox root: the driver's overlay reaches upper and work
	// through an idmapped copy of this tmpfs as sandbox root, who has no
	// access to a dir of host root's.
	if err := os.Lchown(rw, rootUID, rootUID); err != nil {
		return nil, fmt.Errorf("chown %s: %w", rw, err)
	}
	upper, work := filepath.Join(rw, "upper"), filepath.Join(rw, "work")
	fi, err := os.Stat(lower)
	if err != nil {
		return nil, fmt.Errorf("stat codebase tree: %w", err)
	}
	if err := os.Mkdir(upper, fi.Mode().Perm()); err != nil {
		return nil, fmt.Errorf("create upper dir: %w", err)
	}
	if err := os.Chmod(upper, fi.Mode().Perm()); err != nil {
		return nil, fmt.Errorf("chmod upper dir: %w", err)
	}
	if err := os.Mkdir(work, 0o700); err != nil {
		return nil, fmt.Errorf("create work dir: %w", err)
	}
	// Both owned by sandbox root: the driver's overlay works in them as
	// sandbox root.
	for _, d := range []string{upper, work} {
		if err := os.Lchown(d, rootUID, rootUID); err != nil {
			return nil, fmt.Errorf("chown %s: %w", d, err)
		}
	}
	ok = true
	return &runtime.CodebaseMount{Lower: lower, Upper: upper, Work: work}, nil
}

// unmountLayer undoes mountLayer (also half-made ones) and removes dir.
func unmountLayer(dir string) error {
	if err := hostmount.Unmount(filepath.Join(dir, "rw")); err != nil {
		return err
	}
	return removeUnmounted(dir)
}

// removeUnmounted unmounts anything still mounted under dir, then removes it.
func removeUnmounted(dir string) error {
	mounts, err := hostmount.Under(dir)
	if err != nil {
		return err
	}
	for _, mp := range mounts {
		if err := hostmount.Unmount(mp); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// isWhiteout reports an overlayfs whiteout (a 0/0 character device).
func isWhiteout(mode uint32, rdev uint64) bool {
	return mode&unix.S_IFMT == unix.S_IFCHR && rdev == 0
}
