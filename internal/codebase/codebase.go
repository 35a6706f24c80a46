// Package codebase owns codebases: file trees uploaded once and mounted into
// many sandboxes, each sandbox writing into its own copy-on-write layer, and
// synced back as new revisions with conflict detection.
//
// Layout under its directory (<data>/codebases):
//
//	trees/<id>/<rev>/        one immutable tree per revision; a new revision
//	                         is a hardlink copy of the previous one plus the
//	                         changes (changed files are new inodes, so a tree
//	                         is never written once made and overlayfs never
//	                         sees a lower layer change)
//	mounts/<sandbox>/<hash>/ per mount: rw/ (a tmpfs the size of the
//	                         sandbox's disk limit, holding upper/ and work/);
//	                         the box's driver assembles the overlay of the
//	                         tree under it (runtime.Mount.Overlay)
//	tmp/                     uploads being extracted
//
// Every codebase belongs to a tenant (tenant.FromContext of the request
// that made it; "" in single-user mode): Get, List, Download, Delete and
// Mount see only the caller's tenant's, and names are per tenant. A sync
// reaches a codebase through its sandbox's mount, which only the owning
// tenant could make.
//
// Metadata lives in the daemon's SQLite database (internal/store): the
// codebase and its current revision, the revision at which each path last
// changed, the mounts (with the revision of their lower layer) and, per
// mount, what the sandbox already synced. Files are owned by sandbox root
// (host uid UIDShift). Uploads go through the hostile-tar extractor in
// extract_linux.go. It imports internal/store, internal/tenant and errdefs; internal/sandbox reaches it through an
// interface wired by internal/daemon, internal/server calls it directly.
package codebase

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"sync"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/safepath"
	"github.com/sbxdev/sbx/internal/store"
	"github.com/sbxdev/sbx/internal/tenant"
)

// Defaults of Config.
const (
	DefaultMaxBytes   = 4 << 30
	DefaultMaxEntries = 1_000_000
	// DefaultMountPath is where a codebase appears in a sandbox unless told.
	DefaultMountPath = "/workspace"
)

var nameRe = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

// Config wires a Manager.
type Config struct {
	// Dir is the manager's directory (created if missing).
	Dir   string
	Store *store.Store
	// UIDShift is the host uid/gid of sandbox root, IDRange the size of the
	// sandboxes' id range.
	UIDShift, IDRange uint32
	// MaxBytes bounds one upload's file data, MaxEntries its entries.
	MaxBytes   int64
	MaxEntries int
	Logger     *slog.Logger
	// Storage, when set, admits the growth of a tenant's codebases (a
	// create, a sync) against its storage quota.
	Storage Storage
}

// Storage admits growth against the storage quota of ctx's tenant.
type Storage interface {
	// ReserveStorage returns once add more bytes fit ctx's tenant's
	// quota (else an error wrapping errdefs.ErrResourceExhausted naming
	// it); the admission holds until release, by which time the bytes
	// must be accounted (the codebase's record written).
	ReserveStorage(ctx context.Context, add int64) (release func(), err error)
}

// reserve is Config.Storage's ReserveStorage, or nothing without one.
func (m *Manager) reserve(ctx context.Context, add int64) (func(), error) {
	if m.cfg.Storage == nil {
		return func() {}, nil
	}
	return m.cfg.Storage.ReserveStorage(ctx, add)
}

// owner is the tenant a request acts for.
func owner(ctx context.Context) string { return tenant.FromContext(ctx).Tenant }

// Manager manages the codebases of one data dir. Safe for concurrent use.
type Manager struct {
	cfg Config
	log *slog.Logger

	// mu serialises changes of trees and mounts (create's rename, sync,
	// mount, unmount, delete, gc); downloads hold it for reading so that gc
	// does not remove the tree they read.
	mu sync.RWMutex
}

// Open returns a Manager over cfg.Dir, removing leftovers of interrupted
// uploads and syncs. Call Cleanup once the live sandboxes are known.
func Open(ctx context.Context, cfg Config) (*Manager, error) {
	if cfg.Store == nil {
		return nil, errors.New("codebase manager needs a store")
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.MaxEntries == 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	if cfg.IDRange == 0 {
		cfg.IDRange = 65536
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m := &Manager{cfg: cfg, log: cfg.Logger}
	// 0711: the driver mounts a box's codebase overlay as the box's root,
	// which must traverse to the trees and layers.
	for _, d := range []string{cfg.Dir, m.treesDir(), m.mountsDir(), m.tmpDir()} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("create codebase dir: %w", err)
		}
	}
	if err := clearDir(m.tmpDir()); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *Manager) treesDir() string  { return filepath.Join(m.cfg.Dir, "trees") }
func (m *Manager) mountsDir() string { return filepath.Join(m.cfg.Dir, "mounts") }
func (m *Manager) tmpDir() string    { return filepath.Join(m.cfg.Dir, "tmp") }
func (m *Manager) tree(id string, rev int64) string {
	return filepath.Join(m.treesDir(), id, strconv.FormatInt(rev, 10))
}

func clearDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("remove leftover %s: %w", e.Name(), err)
		}
	}
	return nil
}

func newID() string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return "cb-" + hex.EncodeToString(b)
}

// skippedJSON is how skipped-file reports are stored.
type skippedJSON struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	Reason string `json:"reason"`
}

// maxStoredSkipped bounds the skipped report kept with a codebase.
const maxStoredSkipped = 10000

// Create extracts the tar r (hostile input) into a new codebase. The
// returned report holds the header's skipped files plus those the daemon
// skipped (larger than hdr.MaxFileBytes).
func (m *Manager) Create(ctx context.Context, hdr *sbxv1.CreateCodebaseHeader, r io.Reader) (*sbxv1.Codebase, []*sbxv1.SkippedFile, error) {
	if name := hdr.GetName(); name != "" && !nameRe.MatchString(name) {
		return nil, nil, fmt.Errorf("codebase name %q: must match [a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}: %w", name, errdefs.ErrInvalidArgument)
	}
	if hdr.GetMaxFileBytes() < 0 {
		return nil, nil, fmt.Errorf("max_file_bytes %d: must not be negative: %w", hdr.GetMaxFileBytes(), errdefs.ErrInvalidArgument)
	}
	if hdr.GetName() != "" {
		if _, err := m.cfg.Store.GetCodebase(ctx, owner(ctx), hdr.GetName()); err == nil {
			return nil, nil, fmt.Errorf("codebase name %q is taken: %w", hdr.GetName(), errdefs.ErrAlreadyExists)
		}
	}
	skipped := append([]*sbxv1.SkippedFile(nil), hdr.GetSkipped()...)
	tmp, err := os.MkdirTemp(m.tmpDir(), "upload-")
	if err != nil {
		return nil, nil, fmt.Errorf("create upload dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	tree := filepath.Join(tmp, "tree")
	if err := os.Mkdir(tree, 0o755); err != nil {
		return nil, nil, fmt.Errorf("create upload dir: %w", err)
	}
	xs, err := extractTree(ctx, r, tree, extractOpts{
		uid: int(m.cfg.UIDShift), gid: int(m.cfg.UIDShift), maxBytes: m.cfg.MaxBytes, maxEntries: m.cfg.MaxEntries,
		maxFileBytes: hdr.GetMaxFileBytes(), log: m.log,
		skip: func(name string, size int64, reason string) {
			skipped = append(skipped, &sbxv1.SkippedFile{Path: name, SizeBytes: size, Reason: reason})
		},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("extract codebase upload: %w", err)
	}
	files, size := xs.Files, xs.Bytes
	stored := make([]skippedJSON, 0, min(len(skipped), maxStoredSkipped))
	for i, s := range skipped {
		if i == maxStoredSkipped {
			break
		}
		stored = append(stored, skippedJSON{s.GetPath(), s.GetSizeBytes(), s.GetReason()})
	}
	sj, err := json.Marshal(stored)
	if err != nil {
		return nil, nil, fmt.Errorf("encode skipped report: %w", err)
	}
	now := time.Now().UnixMilli()
	rec := &store.CodebaseRecord{
		ID: newID(), Name: hdr.GetName(), Revision: 1, FileCount: files, SizeBytes: size,
		CreatedAtMs: now, UpdatedAtMs: now, Skipped: sj, Tenant: owner(ctx),
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	release, err := m.reserve(ctx, size)
	if err != nil {
		return nil, nil, fmt.Errorf("create codebase: %w", err)
	}
	defer release()
	if err := os.MkdirAll(filepath.Join(m.treesDir(), rec.ID), 0o711); err != nil {
		return nil, nil, fmt.Errorf("create codebase dir: %w", err)
	}
	if err := os.Rename(tree, m.tree(rec.ID, 1)); err != nil {
		os.RemoveAll(filepath.Join(m.treesDir(), rec.ID))
		return nil, nil, fmt.Errorf("store codebase tree: %w", err)
	}
	if err := m.cfg.Store.InsertCodebase(ctx, rec); err != nil {
		os.RemoveAll(filepath.Join(m.treesDir(), rec.ID))
		return nil, nil, err
	}
	m.log.Info("codebase created", "codebase", rec.ID, "name", rec.Name, "files", files, "bytes", size, "skipped", len(skipped))
	cb, err := m.toProto(ctx, rec)
	return cb, skipped, err
}

func (m *Manager) toProto(ctx context.Context, rec *store.CodebaseRecord) (*sbxv1.Codebase, error) {
	mounts, err := m.cfg.Store.CodebaseMounts(ctx, "")
	if err != nil {
		return nil, err
	}
	cb := &sbxv1.Codebase{
		Id: rec.ID, Name: rec.Name, Revision: rec.Revision, FileCount: rec.FileCount, SizeBytes: rec.SizeBytes,
		CreatedAtMs: rec.CreatedAtMs, UpdatedAtMs: rec.UpdatedAtMs,
	}
	seen := map[string]bool{}
	for _, mt := range mounts {
		if mt.CodebaseID == rec.ID && !seen[mt.SandboxID] {
			seen[mt.SandboxID] = true
			cb.Sandboxes = append(cb.Sandboxes, mt.SandboxID)
		}
	}
	var skipped []skippedJSON
	if len(rec.Skipped) > 0 {
		if err := json.Unmarshal(rec.Skipped, &skipped); err != nil {
			return nil, fmt.Errorf("decode skipped report of %s: %w", rec.ID, err)
		}
	}
	for _, s := range skipped {
		cb.Skipped = append(cb.Skipped, &sbxv1.SkippedFile{Path: s.Path, SizeBytes: s.Size, Reason: s.Reason})
	}
	return cb, nil
}

// Get describes a codebase by id or name.
func (m *Manager) Get(ctx context.Context, ref string) (*sbxv1.Codebase, error) {
	if ref == "" {
		return nil, fmt.Errorf("no codebase id or name given: %w", errdefs.ErrInvalidArgument)
	}
	rec, err := m.cfg.Store.GetCodebase(ctx, owner(ctx), ref)
	if err != nil {
		return nil, err
	}
	return m.toProto(ctx, rec)
}

// List describes ctx's tenant's codebases, oldest first.
func (m *Manager) List(ctx context.Context) ([]*sbxv1.Codebase, error) {
	recs, err := m.cfg.Store.TenantCodebases(ctx, owner(ctx))
	if err != nil {
		return nil, err
	}
	out := make([]*sbxv1.Codebase, 0, len(recs))
	for _, r := range recs {
		cb, err := m.toProto(ctx, r)
		if err != nil {
			return nil, err
		}
		out = append(out, cb)
	}
	return out, nil
}

// Delete removes a codebase no sandbox mounts.
func (m *Manager) Delete(ctx context.Context, ref string) error {
	if ref == "" {
		return fmt.Errorf("no codebase id or name given: %w", errdefs.ErrInvalidArgument)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, err := m.cfg.Store.GetCodebase(ctx, owner(ctx), ref)
	if err != nil {
		return err
	}
	mounts, err := m.cfg.Store.CodebaseMounts(ctx, "")
	if err != nil {
		return err
	}
	var users []string
	for _, mt := range mounts {
		if mt.CodebaseID == rec.ID {
			users = append(users, mt.SandboxID)
		}
	}
	if len(users) > 0 {
		return fmt.Errorf("codebase %s is mounted by sandboxes %v: %w", ref, users, errdefs.ErrFailedPrecondition)
	}
	if err := m.cfg.Store.DeleteCodebase(ctx, rec.ID); err != nil {
		return err
	}
	if err := os.RemoveAll(filepath.Join(m.treesDir(), rec.ID)); err != nil {
		return fmt.Errorf("remove codebase tree: %w", err)
	}
	m.log.Info("codebase deleted", "codebase", rec.ID)
	return nil
}

// Bytes is what tenant t's codebases hold at their current revisions.
func (m *Manager) Bytes(ctx context.Context, t string) (int64, error) {
	return m.cfg.Store.CodebaseBytes(ctx, t)
}

// Download writes the current revision of a codebase to w as a tar, owners
// shifted back to sandbox ids.
func (m *Manager) Download(ctx context.Context, ref string, w io.Writer) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	rec, err := m.cfg.Store.GetCodebase(ctx, owner(ctx), ref)
	if err != nil {
		return err
	}
	tree, err := safepath.OpenRoot(m.tree(rec.ID, rec.Revision))
	if err != nil {
		return fmt.Errorf("open codebase tree: %w", err)
	}
	defer tree.Close()
	return writeTar(ctx, tree, w, m.cfg.UIDShift, m.cfg.IDRange)
}

// removeTree removes one of the manager's own directories (a revision tree,
// a sync in progress) and everything in it. dir itself is the daemon's
// path; what is below it came from sandboxes, and os.RemoveAll removes that
// through directory handles (unlinkat, openat with O_NOFOLLOW), never
// following a symlink it holds.
func removeTree(dir string) error { return os.RemoveAll(dir) }

// gcLocked removes revision trees that are neither current nor the lower
// layer of a mount, and trees of codebases that no longer exist.
func (m *Manager) gcLocked(ctx context.Context) {
	recs, err := m.cfg.Store.ListCodebases(ctx)
	if err != nil {
		m.log.Error("codebase gc: list codebases", "err", err)
		return
	}
	mounts, err := m.cfg.Store.CodebaseMounts(ctx, "")
	if err != nil {
		m.log.Error("codebase gc: list mounts", "err", err)
		return
	}
	keep := map[string]map[string]bool{}
	for _, r := range recs {
		keep[r.ID] = map[string]bool{strconv.FormatInt(r.Revision, 10): true}
	}
	for _, mt := range mounts {
		if keep[mt.CodebaseID] == nil {
			keep[mt.CodebaseID] = map[string]bool{}
		}
		keep[mt.CodebaseID][strconv.FormatInt(mt.LowerRev, 10)] = true
	}
	ids, err := os.ReadDir(m.treesDir())
	if err != nil {
		m.log.Error("codebase gc: read trees", "err", err)
		return
	}
	for _, id := range ids {
		revs := keep[id.Name()]
		dir := filepath.Join(m.treesDir(), id.Name())
		if revs == nil {
			m.log.Info("codebase gc: removing tree of unknown codebase", "codebase", id.Name())
			if err := os.RemoveAll(dir); err != nil {
				m.log.Error("codebase gc", "err", err)
			}
			continue
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		names := make([]string, 0, len(ents))
		for _, e := range ents {
			names = append(names, e.Name())
		}
		sort.Strings(names)
		for _, n := range names {
			if !revs[n] {
				if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
					m.log.Error("codebase gc", "err", err)
				}
			}
		}
	}
}

// GC removes revision trees no sandbox needs.
func (m *Manager) GC(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gcLocked(ctx)
}
