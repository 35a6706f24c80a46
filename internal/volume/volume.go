// Package volume owns named persistent volumes: one sparse ext4 image per
// volume under <dir>/<name>/image (its size is the volume's quota),
// loop-mounted at <dir>/<name>/mnt for as long as the volume exists (mounts
// are left in place when the daemon stops and re-made at start if missing),
// with metadata in <dir>/<name>/volume.json. Sandboxes bind-mount mnt; this
// package knows no sandbox beyond the Users callback that names them.
package volume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/atomicfile"
	"github.com/sbxdev/sbx/internal/errdefs"
)

// Size bounds and default.
const (
	MinSize     = 8 << 20
	MaxSize     = 1 << 40
	DefaultSize = 1 << 30
)

var nameRe = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

type meta struct {
	Name        string `json:"name"`
	SizeBytes   int64  `json:"size_bytes"`
	CreatedAtMs int64  `json:"created_at_ms"`
}

// Manager manages the volumes of one data dir. Safe for concurrent use.
type Manager struct {
	dir string
	// rootOwner owns new volumes' root dirs (see Open).
	rootOwner uint32
	log       *slog.Logger

	mu    sync.Mutex
	users func(name string) []string
}

// Open returns a Manager over dir (created if missing), mounting every
// volume not mounted yet and removing leftovers of interrupted creates.
// rootOwner is the host uid/gid that owns a new volume's root directory:
// box uid 0 as the runtime drivers store it (runtime.Info.StoredIDs.Base).
func Open(ctx context.Context, dir string, rootOwner uint32, log *slog.Logger) (*Manager, error) {
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, fmt.Errorf("create volumes dir: %w", err)
	}
	m := &Manager{dir: dir, rootOwner: rootOwner, log: log}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read volumes dir: %w", err)
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		name := e.Name()
		if _, err := m.read(name); err != nil {
			log.Warn("removing incomplete volume", "volume", name, "err", err)
			if err := m.destroy(name); err != nil {
				log.Error("removing incomplete volume", "volume", name, "err", err)
			}
			continue
		}
		if err := m.mount(ctx, name); err != nil {
			log.Error("mounting volume", "volume", name, "err", err)
		}
	}
	return m, nil
}

// SetUsers sets the callback naming the live sandboxes using a volume.
func (m *Manager) SetUsers(f func(name string) []string) {
	m.mu.Lock()
	m.users = f
	m.mu.Unlock()
}

func (m *Manager) volDir(name string) string { return filepath.Join(m.dir, name) }
func (m *Manager) mntDir(name string) string { return filepath.Join(m.dir, name, "mnt") }
func (m *Manager) image(name string) string  { return filepath.Join(m.dir, name, "image") }
func (m *Manager) metaFile(name string) string {
	return filepath.Join(m.dir, name, "volume.json")
}

func (m *Manager) read(name string) (meta, error) {
	var md meta
	if err := atomicfile.ReadJSON(m.metaFile(name), &md); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return md, fmt.Errorf("volume %q: %w", name, errdefs.ErrNotFound)
		}
		return md, err
	}
	return md, nil
}

func checkName(name string) error {
	if !nameRe.MatchString(name) {
		return fmt.Errorf("volume name %q: must match [a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Create makes a volume of size bytes (0: DefaultSize).
func (m *Manager) Create(ctx context.Context, name string, size int64) (*sbxv1.Volume, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if size == 0 {
		size = DefaultSize
	}
	if size < MinSize || size > MaxSize {
		return nil, fmt.Errorf("volume size %d: must be between %d and %d bytes: %w", size, int64(MinSize), int64(MaxSize), errdefs.ErrInvalidArgument)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := os.Mkdir(m.volDir(name), 0o711); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("volume %q: %w", name, errdefs.ErrAlreadyExists)
		}
		return nil, fmt.Errorf("create volume dir: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			if err := m.destroy(name); err != nil {
				m.log.Error("rolling back volume create", "volume", name, "err", err)
			}
		}
	}()
	f, err := os.OpenFile(m.image(name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create volume image: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("size volume image: %w", err)
	}
	owner := fmt.Sprintf("root_owner=%d:%d", m.rootOwner, m.rootOwner)
	if out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-E", owner, m.image(name)).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mkfs.ext4: %w: %s", err, strings.TrimSpace(string(out)))
	}
	if err := m.mount(ctx, name); err != nil {
		return nil, err
	}
	md := meta{Name: name, SizeBytes: size, CreatedAtMs: time.Now().UnixMilli()}
	if err := atomicfile.WriteJSON(m.metaFile(name), md); err != nil {
		return nil, fmt.Errorf("write volume metadata: %w", err)
	}
	ok = true
	m.log.Info("volume created", "volume", name, "size", size)
	return m.info(md, nil), nil
}

// mounted reports whether something is mounted at mnt.
func mounted(mnt string) (bool, error) {
	var st, pst unix.Stat_t
	if err := unix.Stat(mnt, &st); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return false, err
	}
	if err := unix.Stat(filepath.Dir(mnt), &pst); err != nil {
		return false, err
	}
	return st.Dev != pst.Dev, nil
}

func (m *Manager) mount(ctx context.Context, name string) error {
	mnt := m.mntDir(name)
	if err := os.MkdirAll(mnt, 0o711); err != nil {
		return fmt.Errorf("create volume mount point: %w", err)
	}
	if ok, err := mounted(mnt); err != nil || ok {
		return err
	}
	// mount(8) sets the loop device up with autoclear: it goes with the
	// last unmount.
	if out, err := exec.CommandContext(ctx, "mount", "-t", "ext4", "-o", "loop,nosuid,nodev", m.image(name), mnt).CombinedOutput(); err != nil {
		return fmt.Errorf("mount volume %q: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// destroy unmounts and deletes everything of a volume.
func (m *Manager) destroy(name string) error {
	mnt := m.mntDir(name)
	// The metadata goes first: a crash from here on leaves an incomplete
	// volume that Open removes.
	if err := os.Remove(m.metaFile(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for i := 0; ; i++ {
		ok, err := mounted(mnt)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if err := unix.Unmount(mnt, 0); err != nil {
			if i < 20 && errors.Is(err, syscall.EBUSY) {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			return fmt.Errorf("unmount volume %q: %w", name, err)
		}
	}
	if err := os.RemoveAll(m.volDir(name)); err != nil {
		return fmt.Errorf("remove volume %q: %w", name, err)
	}
	return nil
}

func (m *Manager) info(md meta, users []string) *sbxv1.Volume {
	v := &sbxv1.Volume{Name: md.Name, SizeBytes: md.SizeBytes, CreatedAtMs: md.CreatedAtMs, Sandboxes: users}
	var st unix.Statfs_t
	if err := unix.Statfs(m.mntDir(md.Name), &st); err == nil {
		v.UsedBytes = int64(st.Blocks-st.Bfree) * int64(st.Bsize) // Bsize is uint32 off Linux
	}
	return v
}

func (m *Manager) usersOf(name string) []string {
	if m.users == nil {
		return nil
	}
	u := m.users(name)
	sort.Strings(u)
	return u
}

// Get describes a volume.
func (m *Manager) Get(_ context.Context, name string) (*sbxv1.Volume, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	md, err := m.read(name)
	if err != nil {
		return nil, err
	}
	return m.info(md, m.usersOf(name)), nil
}

// List describes every volume, by name.
func (m *Manager) List(_ context.Context) ([]*sbxv1.Volume, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ents, err := os.ReadDir(m.dir)
	if err != nil {
		return nil, fmt.Errorf("read volumes dir: %w", err)
	}
	var out []*sbxv1.Volume
	for _, e := range ents {
		md, err := m.read(e.Name())
		if err != nil {
			continue
		}
		out = append(out, m.info(md, m.usersOf(e.Name())))
	}
	return out, nil
}

// Remove deletes a volume and its data. It fails with
// errdefs.ErrFailedPrecondition while a sandbox uses the volume.
func (m *Manager) Remove(_ context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.read(name); err != nil {
		return err
	}
	if u := m.usersOf(name); len(u) > 0 {
		return fmt.Errorf("volume %q is in use by sandbox %s: %w", name, strings.Join(u, ", "), errdefs.ErrFailedPrecondition)
	}
	if err := m.destroy(name); err != nil {
		return err
	}
	m.log.Info("volume removed", "volume", name)
	return nil
}

// Path returns the host directory to bind-mount for a volume.
func (m *Manager) Path(_ context.Context, name string) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.read(name); err != nil {
		return "", err
	}
	return m.mntDir(name), nil
}
