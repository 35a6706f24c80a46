package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sync"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/builder"
	"github.com/sbxdev/sbx/internal/image"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/sandbox"
	"github.com/sbxdev/sbx/internal/server"
)

var _ sandbox.ImageCommitter = imageResolver{}

// Commit makes an image of a sandbox's changes on top of its image: the
// base's entrypoint, cmd and labels, the sandbox's env, workdir and user.
func (r imageResolver) Commit(ctx context.Context, base string, layer io.Reader, cfg sandbox.SnapshotConfig, tag string) (string, error) {
	var c image.ImageConfig
	store, err := r.stores.Images(ctx)
	if err != nil {
		return "", err
	}
	if base != "" {
		b, err := store.Get(ctx, base)
		if err != nil {
			return "", fmt.Errorf("base image: %w", err)
		}
		c, base = b.Config, b.Digest
	}
	c.Env, c.WorkingDir, c.User = cfg.Env, cfg.Workdir, cfg.User
	if len(cfg.Labels) > 0 {
		c.Labels = maps.Clone(c.Labels)
		if c.Labels == nil {
			c.Labels = map[string]string{}
		}
		maps.Copy(c.Labels, cfg.Labels)
	}
	img, err := store.Commit(ctx, base, layer, c, tag)
	if err != nil {
		return "", err
	}
	return img.Digest, nil
}

// newImageServer serves the image stores, with builds. A build uses its
// tenant's store and step cache, and its step sandboxes are the tenant's.
func newImageServer(stores *server.TenantStores, mgr *sandbox.Manager, gc *sync.RWMutex,
	defaults runtime.Resources, log *slog.Logger) (*server.ImageServer, error) {
	srv := server.NewImageServer(stores, gc)
	lim := hostLimits()
	mem := max(defaults.MemoryBytes, min(4<<30, lim.MaxMemoryBytes/2))
	res := &sbxv1.Resources{
		MemoryBytes: mem,
		CpuMillis:   lim.MaxCPUMillis,
		Pids:        max(defaults.Pids, 4096),
		// The oci driver keeps the disk in the box's memory.
		DiskBytes: sandbox.MaxDiskInMemory(mem),
	}
	b, err := builder.New(builder.Config{
		Manager: mgr, Stores: stores, Resources: res, Storage: stores.CheckStorage, Logger: log.With("component", "builder"),
		Pull: server.NewPuller(stores, gc).Pull,
	})
	if err != nil {
		return nil, err
	}
	srv.SetBuilder(b)
	return srv, nil
}
