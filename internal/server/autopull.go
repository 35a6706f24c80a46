package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/image"
	"github.com/sbxdev/sbx/internal/tenant"
)

// Puller pulls images into the caller's tenant's store within its storage
// quota: the quota is checked before the pull starts and, the image's size
// known only at the end, the image is removed again if it took the tenant
// over (undoOverQuota). PullImage and creates of images not stored yet
// (AutoPull) both pull through it; concurrent pulls of one ref in one
// tenant's store fetch it once (image.Store.Pull joins them).
type Puller struct {
	stores Stores
	// gc is the daemon's image garbage-collection lock (see ImageServer.gc).
	gc *sync.RWMutex
}

// NewPuller returns a Puller over the tenants' stores.
func NewPuller(stores Stores, gc *sync.RWMutex) *Puller { return &Puller{stores: stores, gc: gc} }

// Pull pulls ref into ctx's tenant's store.
func (p *Puller) Pull(ctx context.Context, ref string, progress func(image.Progress)) (*image.Image, error) {
	store, err := p.stores.Images(ctx)
	if err != nil {
		return nil, err
	}
	if err := p.stores.CheckStorage(ctx); err != nil {
		return nil, err
	}
	img, err := store.Pull(ctx, ref, progress)
	if err != nil {
		return nil, err
	}
	if err := undoOverQuota(ctx, p.stores, p.gc, store, img.Ref); err != nil {
		return nil, err
	}
	return img, nil
}

// AutoPull pulls the image a create names when the tenant's store does not
// have it yet. It refuses, with notFound (the store's own answer, which
// names the image):
// the built-in "host" image and bare digests ("sha256:..."; nothing to pull
// them from), and requests made with a scoped sandbox token, which may not
// pull (a box must not make the daemon fetch from registries, loopback
// ones included, on its behalf). A reference that does not parse fails
// with InvalidArgument naming it, a registry that has no such image with
// NotFound naming it.
func (p *Puller) AutoPull(ctx context.Context, ref string, notFound error) (*image.Image, error) {
	if ref == "host" || strings.HasPrefix(ref, "sha256:") {
		return nil, notFound
	}
	if tenant.FromContext(ctx).Scope != "" {
		return nil, fmt.Errorf("%w (a scoped sandbox token may not pull images; its parent must pull or build it first)", notFound)
	}
	img, err := p.Pull(ctx, ref, nil)
	if err != nil {
		if errors.Is(err, errdefs.ErrInvalidArgument) {
			return nil, fmt.Errorf("image %q is not a valid reference and not in the image store: %w", ref, err)
		}
		// The pull's error names the full reference; say it once.
		if pe := (*image.PullError)(nil); errors.As(err, &pe) {
			return nil, fmt.Errorf("image %s is not in the image store and pulling it failed: %w", pe.Name, pe.Err)
		}
		return nil, fmt.Errorf("image %q is not in the image store and pulling it failed: %w", ref, err)
	}
	return img, nil
}

// undoOverQuota removes images refs again if adding them took ctx's
// tenant past its storage_bytes quota, and frees the layers no image uses
// then; the error names the quota.
func undoOverQuota(ctx context.Context, stores Stores, gc *sync.RWMutex, store *image.Store, refs ...string) error {
	p := tenant.FromContext(ctx)
	if p.Quotas.StorageBytes == 0 {
		return nil
	}
	err := stores.CheckStorage(ctx)
	if err == nil {
		return nil
	}
	gc.Lock()
	defer gc.Unlock()
	in := stores.InUse(ctx)
	for _, ref := range refs {
		if img, gerr := store.Get(ctx, ref); gerr == nil && !in[img.Digest] {
			_ = store.Remove(ctx, ref)
		}
	}
	_, _ = store.Prune(ctx, layersInUse(ctx, stores, store))
	return err
}

// layersInUse are the layers of the images ctx's tenant's sandboxes use.
func layersInUse(ctx context.Context, stores Stores, store *image.Store) map[string]bool {
	layers := map[string]bool{}
	for digest := range stores.InUse(ctx) {
		if img, err := store.Get(ctx, digest); err == nil {
			for _, l := range img.Layers {
				layers[l] = true
			}
		}
	}
	return layers
}
