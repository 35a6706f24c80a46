package daemon

import (
	"context"
	"fmt"
	"log/slog"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/events"
	"github.com/sbxdev/sbx/internal/metrics"
	"github.com/sbxdev/sbx/internal/sandbox"
	"github.com/sbxdev/sbx/internal/server"
	"github.com/sbxdev/sbx/internal/tenant"
)

// observe starts the sampler (until ctx ends) and the metrics, and
// publishes that the daemon started.
func observe(ctx context.Context, mgr *sandbox.Manager, bus *events.Bus, stores *server.TenantStores, cfg Config, log *slog.Logger) *server.Observer {
	sampler := metrics.NewSampler(mgr, metrics.SamplerConfig{Interval: cfg.StatsInterval, Logger: log.With("component", "sampler")})
	m := metrics.New(metrics.Config{
		Sampler: sampler, Events: bus, PoolSize: mgr.PoolSize,
		Storage: func(ctx context.Context) (metrics.Storage, error) { return storageOf(ctx, stores, cfg.Tenants) },
	})
	go sampler.Run(ctx)
	bus.Publish(events.Record{Daemon: true, Event: &sbxv1.Event{Type: sbxv1.EventType_EVENT_TYPE_DAEMON_STARTED,
		Detail: fmt.Sprintf("recovered %d sandboxes", len(mgr.IDs()))}})
	return &server.Observer{Mgr: mgr, Bus: bus, Sampler: sampler, Metrics: m, Done: ctx.Done()}
}

// storageOf sums what every tenant's images, volumes and codebases hold
// (of the tenants that have stores: see TenantStores.HasStores).
func storageOf(ctx context.Context, stores *server.TenantStores, reg *tenant.Registry) (metrics.Storage, error) {
	names := []string{""}
	if reg != nil {
		names = names[:0]
		for _, t := range reg.Current().Tenants() {
			if stores.HasStores(t.Name) {
				names = append(names, t.Name)
			}
		}
	}
	var s metrics.Storage
	for _, n := range names {
		u, err := stores.StorageUsage(tenant.WithPrincipal(ctx, tenant.Principal{Tenant: n}))
		if err != nil {
			return s, fmt.Errorf("storage of tenant %q: %w", n, err)
		}
		s.Images += u.Images
		s.Volumes += u.Volumes
		s.Codebases += u.Codebases
	}
	return s, nil
}
