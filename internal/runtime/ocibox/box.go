package ocibox

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/sbxdev/sbx/internal/cleanup"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/hostmount"
)

var validID = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

// CheckID checks a box id names a host resource safely: [a-z0-9-], at most
// 32 bytes, not starting with '-'. Errors wrap errdefs.ErrInvalidArgument.
func CheckID(id string) error {
	if !validID.MatchString(id) {
		return fmt.Errorf("box id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

// MakeBoxDir creates box id's dir under boxesDir (mode 0711: the box's
// user namespace traverses it) and pushes its removal on undo; remove is
// called to remove it, so a driver can refuse while something is still
// mounted under it. sockets are the Unix socket paths the box will have,
// checked against the kernel's 108-byte limit first. A box dir that exists
// already is errdefs.ErrAlreadyExists.
func MakeBoxDir(boxesDir, id string, undo *cleanup.Stack, remove func(dir string) error, sockets ...string) (string, error) {
	if err := CheckID(id); err != nil {
		return "", err
	}
	for _, s := range sockets {
		if len(s) >= 108 {
			return "", fmt.Errorf("socket path %s too long; use a shorter state dir: %w", s, errdefs.ErrInvalidArgument)
		}
	}
	box := filepath.Join(boxesDir, id)
	if err := os.Mkdir(box, 0o711); err != nil {
		if errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("box %s: %w", id, errdefs.ErrAlreadyExists)
		}
		return "", fmt.Errorf("create box dir: %w", err)
	}
	undo.Add(func() error { return remove(box) })
	return box, nil
}

// WritableLayer mounts a tmpfs of size bytes (0: unbounded) at rw (made
// 0700), the box's disk: its pages are charged to the memory cgroup of
// whoever writes them, the box. It makes upper/, work/ and dirs (relative
// names) on it, owned by root (the host uid of box root in stored trees),
// pushes the unmount on undo and returns the upper and work dirs.
func WritableLayer(rw string, size int64, root int, undo *cleanup.Stack, dirs ...string) (upper, work string, err error) {
	if err := os.Mkdir(rw, 0o700); err != nil {
		return "", "", fmt.Errorf("create rw dir: %w", err)
	}
	if err := hostmount.Tmpfs(rw, size); err != nil {
		return "", "", err
	}
	undo.Add(func() error { return hostmount.Unmount(rw) })
	upper, work = filepath.Join(rw, "upper"), filepath.Join(rw, "work")
	for _, d := range append([]string{upper, work}, prefixed(rw, dirs)...) {
		if err := os.Mkdir(d, 0o755); err != nil {
			return "", "", fmt.Errorf("create writable layer dirs: %w", err)
		}
		if err := os.Chown(d, root, root); err != nil {
			return "", "", fmt.Errorf("chown writable layer dirs: %w", err)
		}
	}
	return upper, work, nil
}

func prefixed(dir string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = filepath.Join(dir, n)
	}
	return out
}

// LogTail returns the end (2 KiB) of the first non-empty log for error
// messages ("; log: ..."), or "".
func LogTail(paths ...string) string {
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil || len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		if len(b) > 2048 {
			b = b[len(b)-2048:]
		}
		return "; log: " + strings.TrimSpace(string(b))
	}
	return ""
}

// DefaultBoxesCPUShares is the CPU weight of all of one driver's boxes
// together by default: an eighth of one busy host process, so that the
// daemon and the agents' control path (whose requests the daemon serves)
// get the CPU at once when every box is busy.
const DefaultBoxesCPUShares = 128
