package network

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// hostLock keeps two daemons off the same host resources: before New
// touches anything on the host (bridge, firewall table, DNS port) it takes
// an exclusive flock on LockDir/bridge-<name>.lock and LockDir/table-<name>.lock
// and writes its pid and state dir into them, so a second daemon given the
// same --net-bridge or --net-table fails at once, naming the first, instead
// of rebuilding (wiping) the first one's table. The kernel drops the locks
// when the daemon exits, however it exits; the files stay (removing them
// would race with a daemon taking them).
type hostLock struct {
	files []*os.File
}

// lockHost takes the bridge and table locks for cfg.
func lockHost(cfg Config) (*hostLock, error) {
	if err := os.MkdirAll(cfg.LockDir, 0o755); err != nil {
		return nil, fmt.Errorf("create network lock dir: %w", err)
	}
	l := &hostLock{}
	for _, res := range []struct{ kind, name, flag string }{
		{"bridge", cfg.Bridge, "--net-bridge"},
		{"table", cfg.Table, "--net-table"},
	} {
		f, err := lockFile(filepath.Join(cfg.LockDir, res.kind+"-"+res.name+".lock"), cfg.StateDir)
		if err != nil {
			l.release()
			if errors.Is(err, errLocked) {
				return nil, fmt.Errorf("network %s %q is in use by another sbx daemon (%s): give this daemon a %s of its own (and a --net-subnet), or stop the other: %w",
					res.kind, res.name, err.Error(), res.flag, errdefs.ErrFailedPrecondition)
			}
			return nil, err
		}
		l.files = append(l.files, f)
	}
	return l, nil
}

// errLocked is a lock another process holds; its message names the holder.
var errLocked = errors.New("locked")

type lockedError struct{ holder string }

func (e lockedError) Error() string        { return e.holder }
func (e lockedError) Is(target error) bool { return target == errLocked }

// lockFile takes an exclusive flock on path and records who holds it.
func lockFile(path, stateDir string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open network lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b := make([]byte, 4096)
		n, _ := f.ReadAt(b, 0)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, lockedError{holder: describeHolder(b[:n], path)}
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	info := "pid " + strconv.Itoa(os.Getpid()) + "\nstate_dir " + stateDir + "\n"
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt([]byte(info), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("write network lock %s: %w", path, err)
	}
	return f, nil
}

// describeHolder turns a lock file's content into "pid N, network state
// dir D" (or says the file does not tell).
func describeHolder(b []byte, path string) string {
	var pid, dir string
	for _, line := range bytes.Split(b, []byte("\n")) {
		k, v, _ := bytes.Cut(line, []byte(" "))
		switch string(k) {
		case "pid":
			pid = string(v)
		case "state_dir":
			dir = string(v)
		}
	}
	if pid == "" {
		return "holder unknown; lock " + path
	}
	return "pid " + pid + ", network state dir " + dir + "; lock " + path
}

func (l *hostLock) release() {
	for _, f := range l.files {
		f.Close()
	}
	l.files = nil
}
