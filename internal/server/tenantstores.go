package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/sbxdev/sbx/internal/image"
	"github.com/sbxdev/sbx/internal/sandbox"
	"github.com/sbxdev/sbx/internal/tenant"
	"github.com/sbxdev/sbx/internal/volume"
)

// TenantStores gives every tenant an image store and volumes of its own,
// under <data dir>/tenants/<name>/{images,volumes}: one tenant's pulls,
// tags, removals and volumes never touch another's, and names are per
// tenant. The single-user owner ("") keeps the daemon's own stores. The
// built-in host image is shared, read-only, by everyone.
type TenantStores struct {
	dir    string       // <data dir>/tenants
	imgCfg image.Config // the owner's, Dir replaced per tenant
	log    *slog.Logger
	owner  *tenantStore
	mgr    *sandbox.Manager // set before serving

	mu sync.Mutex
	// byName holds the tenants' stores opened so far. Guarded by mu.
	byName map[string]*tenantStore
}

type tenantStore struct {
	images *image.Store
	vols   *volume.Manager
}

// NewTenantStores returns the stores of a daemon whose data dir is
// dataDir; images and vols are the single-user owner's, imgCfg their
// configuration (each tenant's differs in Dir alone).
func NewTenantStores(dataDir string, imgCfg image.Config, images *image.Store, vols *volume.Manager, log *slog.Logger) *TenantStores {
	return &TenantStores{dir: filepath.Join(dataDir, "tenants"), imgCfg: imgCfg, owner: &tenantStore{images: images, vols: vols},
		log: log, byName: map[string]*tenantStore{}}
}

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
	return ts.get(ctx, tenant.FromContext(ctx).Tenant)
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
	cfg.Logger = ts.log.With("component", "images", "tenant", t)
	images, err := image.Open(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("image store of tenant %s: %w", t, err)
	}
	vols, err := volume.Open(ctx, filepath.Join(dir, "volumes"), ts.log.With("tenant", t))
	if err != nil {
		images.Close()
		return nil, fmt.Errorf("volumes of tenant %s: %w", t, err)
	}
	if ts.mgr != nil {
		vols.SetUsers(func(name string) []string { return ts.mgr.VolumeUsers(t, name) })
	}
	s := &tenantStore{images: images, vols: vols}
	ts.byName[t] = s
	return s, nil
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

// StorageUsed is what ctx's tenant's layers and volumes (at their full
// size, which their files may grow to) hold, in bytes.
func (ts *TenantStores) StorageUsed(ctx context.Context) (int64, error) {
	s, err := ts.forContext(ctx)
	if err != nil {
		return 0, err
	}
	_, _, layers, err := s.images.DiskUsage(ctx)
	if err != nil {
		return 0, err
	}
	vs, err := s.vols.List(ctx)
	if err != nil {
		return 0, err
	}
	used := layers
	for _, v := range vs {
		used += v.GetSizeBytes()
	}
	return used, nil
}

// InUse returns the digests ctx's tenant's sandboxes use.
func (ts *TenantStores) InUse(ctx context.Context) map[string]bool {
	return ts.mgr.ImagesInUse(tenant.FromContext(ctx).Tenant)
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
