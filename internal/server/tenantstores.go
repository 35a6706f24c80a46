package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/image"
	"github.com/sbxdev/sbx/internal/sandbox"
	"github.com/sbxdev/sbx/internal/tenant"
	"github.com/sbxdev/sbx/internal/volume"
)

// TenantStores gives every tenant an image store and volumes of its own,
// under <data dir>/tenants/<name>/{images,volumes}: one tenant's pulls,
// tags, removals, builds, snapshots and volumes never touch another's, and
// names are per tenant. The single-user owner ("") keeps the daemon's own
// stores. The built-in host image is shared, read-only, by everyone.
// Codebases live in one store with an owner per codebase
// (internal/codebase); TenantStores counts them against the storage quota.
type TenantStores struct {
	dir    string       // <data dir>/tenants
	imgCfg image.Config // the owner's, Dir replaced per tenant
	// tenantPulls is the PullAddrs of tenants' image stores and
	// tenantCreds whether they use the daemon's registry credentials (set
	// by AllowTenantPulls before any is opened).
	tenantPulls func(netip.Addr) error
	tenantCreds bool
	log         *slog.Logger
	owner       *tenantStore
	mgr         *sandbox.Manager // set before serving
	// codebases says what a tenant's codebases hold (nil: none).
	codebases CodebaseBytes

	mu sync.Mutex
	// byName holds the tenants' stores opened so far. Guarded by mu.
	byName map[string]*tenantStore
}

// CodebaseBytes says what a tenant's codebases hold (internal/codebase's
// Manager implements it).
type CodebaseBytes interface {
	Bytes(ctx context.Context, tenant string) (int64, error)
}

type tenantStore struct {
	images    *image.Store
	imagesDir string
	vols      *volume.Manager
	// storageMu serialises the tenant's storage-quota reservations with
	// the growth they admit (ReserveStorage).
	storageMu sync.Mutex
}

// NewTenantStores returns the stores of a daemon whose data dir is
// dataDir; images and vols are the single-user owner's, imgCfg their
// configuration (each tenant's differs in Dir alone).
func NewTenantStores(dataDir string, imgCfg image.Config, images *image.Store, vols *volume.Manager, log *slog.Logger) *TenantStores {
	return &TenantStores{dir: filepath.Join(dataDir, "tenants"), imgCfg: imgCfg, owner: &tenantStore{images: images, imagesDir: imgCfg.Dir, vols: vols},
		log: log, byName: map[string]*tenantStore{}}
}

// SetCodebases counts cbs's codebases in the tenants' storage.
func (ts *TenantStores) SetCodebases(cbs CodebaseBytes) { ts.codebases = cbs }

// OpenExisting opens the stores of every tenant that has some, so that
// their volumes are mounted before recovered sandboxes need them.
func (ts *TenantStores) OpenExisting(ctx context.Context) error {
	ents, err := os.ReadDir(ts.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read tenants dir: %w", err)
	}
	for _, e := range ents {
		if _, err := ts.get(ctx, e.Name()); err != nil {
			return err
		}
	}
	return nil
}

// forContext returns the stores of ctx's tenant.
func (ts *TenantStores) forContext(ctx context.Context) (*tenantStore, error) {
	p := tenant.FromContext(ctx)
	if p.Admin {
		// The admin token is no tenant, and never the owner "".
		return nil, fmt.Errorf("the admin token has no stores of its own: %w", errdefs.ErrPermissionDenied)
	}
	return ts.get(ctx, p.Tenant)
}

// get returns (opening on first use) the stores of tenant t.
func (ts *TenantStores) get(ctx context.Context, t string) (*tenantStore, error) {
	if t == "" {
		return ts.owner, nil
	}
	if !tenant.ValidName(t) {
		return nil, fmt.Errorf("tenant store %q: not a tenant name", t)
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if s, ok := ts.byName[t]; ok {
		return s, nil
	}
	dir := filepath.Join(ts.dir, t)
	// 0711 like the data dir: sandboxes' user namespaces traverse to volumes and layers.
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, fmt.Errorf("create stores of tenant %s: %w", t, err)
	}
	cfg := ts.imgCfg
	cfg.Dir = filepath.Join(dir, "images")
	cfg.PullAddrs, cfg.PullAnonymous = ts.tenantPulls, !ts.tenantCreds
	cfg.Logger = ts.log.With("component", "images", "tenant", t)
	images, err := image.Open(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("image store of tenant %s: %w", t, err)
	}
	vols, err := volume.Open(ctx, filepath.Join(dir, "volumes"), cfg.UIDShift, ts.log.With("tenant", t))
	if err != nil {
		images.Close()
		return nil, fmt.Errorf("volumes of tenant %s: %w", t, err)
	}
	if ts.mgr != nil {
		vols.SetUsers(func(name string) []string { return ts.mgr.VolumeUsers(t, name) })
	}
	s := &tenantStore{images: images, imagesDir: cfg.Dir, vols: vols}
	ts.byName[t] = s
	return s, nil
}

// AllowTenantPulls sets where tenants' pulls (PullImage, a create's
// auto-pull, a build's FROM) may connect: public addresses other than the
// host's, and allow (image.PublicOnly); and whether they use the daemon's
// registry credentials (the operator's docker config; without creds they
// pull anonymously, so no tenant gets what the operator's logins can
// read). Call it before OpenExisting. The single-user owner's pulls are
// not restricted.
func (ts *TenantStores) AllowTenantPulls(allow []netip.Prefix, creds bool) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.tenantPulls, ts.tenantCreds = image.PublicOnly(allow), creds
}

// SetManager lets the volumes ask which sandboxes use them.
func (ts *TenantStores) SetManager(mgr *sandbox.Manager) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.mgr = mgr
	ts.owner.vols.SetUsers(func(name string) []string { return mgr.VolumeUsers("", name) })
	for t, s := range ts.byName {
		s.vols.SetUsers(func(name string) []string { return mgr.VolumeUsers(t, name) })
	}
}

// Close closes the tenants' image stores (the owner's is the daemon's to close).
func (ts *TenantStores) Close() {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for _, s := range ts.byName {
		s.images.Close()
	}
}

// Images is ctx's tenant's image store.
func (ts *TenantStores) Images(ctx context.Context) (*image.Store, error) {
	s, err := ts.forContext(ctx)
	if err != nil {
		return nil, err
	}
	return s.images, nil
}

// Volumes is ctx's tenant's volume manager.
func (ts *TenantStores) Volumes(ctx context.Context) (*volume.Manager, error) {
	s, err := ts.forContext(ctx)
	if err != nil {
		return nil, err
	}
	return s.vols, nil
}

// BuildStore is ctx's tenant's image store and build step cache
// (builder.Stores).
func (ts *TenantStores) BuildStore(ctx context.Context) (*image.Store, string, error) {
	s, err := ts.forContext(ctx)
	if err != nil {
		return nil, "", err
	}
	return s.images, filepath.Join(s.imagesDir, "build-cache"), nil
}

// StorageUse is what a tenant's storage holds, in bytes.
type StorageUse struct {
	// Images counts layers and blobs; Volumes the volumes' full sizes
	// (which their files may grow to); Codebases the current revisions.
	Images, Volumes, Codebases int64
}

// Total is what counts against the storage_bytes quota.
func (u StorageUse) Total() int64 { return u.Images + u.Volumes + u.Codebases }

// StorageUsage is what ctx's tenant's images, volumes and codebases hold.
func (ts *TenantStores) StorageUsage(ctx context.Context) (StorageUse, error) {
	var u StorageUse
	s, err := ts.forContext(ctx)
	if err != nil {
		return u, err
	}
	if _, _, u.Images, err = s.images.DiskUsage(ctx); err != nil {
		return u, err
	}
	vs, err := s.vols.List(ctx)
	if err != nil {
		return u, err
	}
	for _, v := range vs {
		u.Volumes += v.GetSizeBytes()
	}
	if ts.codebases != nil {
		if u.Codebases, err = ts.codebases.Bytes(ctx, tenant.FromContext(ctx).Tenant); err != nil {
			return u, err
		}
	}
	return u, nil
}

// StorageUsed is what ctx's tenant's images, volumes and codebases hold.
func (ts *TenantStores) StorageUsed(ctx context.Context) (int64, error) {
	u, err := ts.StorageUsage(ctx)
	return u.Total(), err
}

// ReserveStorage admits add more bytes for ctx's tenant against its
// storage_bytes quota, or fails wrapping errdefs.ErrResourceExhausted and
// naming the quota. The admission holds (later reservations of the tenant
// wait) until release; account the bytes before releasing. Codebase
// creates and syncs and volume creates reserve; pulls, imports, builds and
// snapshots, whose size is known only at their end, check before and undo
// after (ImageServer.undoOverQuota).
func (ts *TenantStores) ReserveStorage(ctx context.Context, add int64) (release func(), err error) {
	p := tenant.FromContext(ctx)
	if p.Quotas.StorageBytes == 0 {
		return func() {}, nil
	}
	s, err := ts.forContext(ctx)
	if err != nil {
		return nil, err
	}
	s.storageMu.Lock()
	used, err := ts.StorageUsed(ctx)
	if err == nil {
		err = p.Quotas.AdmitStorage(p.Tenant, used, add)
	}
	if err != nil {
		s.storageMu.Unlock()
		return nil, err
	}
	return s.storageMu.Unlock, nil
}

// CheckStorage fails, naming the quota, when ctx's tenant holds more than
// its storage_bytes quota.
func (ts *TenantStores) CheckStorage(ctx context.Context) error {
	p := tenant.FromContext(ctx)
	if p.Quotas.StorageBytes == 0 {
		return nil
	}
	used, err := ts.StorageUsed(ctx)
	if err != nil {
		return err
	}
	return p.Quotas.AdmitStorage(p.Tenant, used, 0)
}

// InUse returns the digests ctx's tenant's sandboxes use.
func (ts *TenantStores) InUse(ctx context.Context) map[string]bool {
	return ts.mgr.ImagesInUse(tenant.FromContext(ctx).Tenant)
}

// settleWait bounds how long Settle waits for teardowns: past it, what the
// dying boxes hold still counts as in use (the caller's check refuses).
const settleWait = 30 * time.Second

// Settle waits for the teardowns of destroyed sandboxes (see Stores).
func (ts *TenantStores) Settle(ctx context.Context) { settle(ctx, ts.mgr) }

// settle waits, at most settleWait, until the sandboxes mgr destroyed so far
// are torn down, so that what only they held (images, volumes, codebase
// mounts) is free again.
func settle(ctx context.Context, mgr *sandbox.Manager) {
	ctx, cancel := context.WithTimeout(ctx, settleWait)
	defer cancel()
	_ = mgr.WaitTeardowns(ctx)
}

// Path resolves a create's volume in its tenant's volumes (sandbox.Volumes).
func (ts *TenantStores) Path(ctx context.Context, name string) (string, error) {
	v, err := ts.Volumes(ctx)
	if err != nil {
		return "", err
	}
	return v.Path(ctx, name)
}

var _ Stores = (*TenantStores)(nil)
