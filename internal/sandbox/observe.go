package sandbox

import (
	"context"
	"strings"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/events"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/tenant"
)

// Observing: the manager publishes its lifecycle events on Config.Events
// and lets internal/metrics' sampler read every box's usage through
// Observe. Neither costs a lifecycle operation more than a publish.

// emit publishes an event of box b (nothing without Config.Events).
func (m *Manager) emit(b *box, t sbxv1.EventType, reason, detail string) {
	if m.cfg.Events == nil {
		return
	}
	m.cfg.Events.Publish(events.Record{Tenant: b.tenant, Parent: b.parent, Event: &sbxv1.Event{
		Type: t, SandboxId: b.id, SandboxName: b.spec().Name, Labels: b.spec().Labels, Reason: reason, Detail: detail,
	}})
}

// Emit publishes an event about sandbox id (exec events from the API
// edge, OOM and limit events from the sampler); unknown ids are ignored.
func (m *Manager) Emit(id string, ev *sbxv1.Event) {
	m.mu.RLock()
	b, ok := m.boxes[id]
	m.mu.RUnlock()
	if !ok || m.cfg.Events == nil {
		return
	}
	ev.SandboxId, ev.SandboxName, ev.Labels = b.id, b.spec().Name, b.spec().Labels
	m.cfg.Events.Publish(events.Record{Tenant: b.tenant, Parent: b.parent, Event: ev})
}

// destroyReason is the short reason word of a destroy's reason text.
func destroyReason(reason string) string {
	switch {
	case reason == "lifetime timeout reached":
		return "timeout"
	case reason == "idle timeout reached":
		return "idle"
	case strings.HasPrefix(reason, "its parent sandbox"):
		return "parent"
	}
	return "user"
}

// exitReason is the short reason word of an agent's death.
func exitReason(ex runtime.Exit) string {
	if ex.OOMKilled {
		return "oom"
	}
	return "crashed"
}

// CanSee reports whether p may observe a sandbox of tenant t with parent
// parent: as for every other call, and the admin token sees every tenant's
// (observing changes nothing); an envd token observes nothing.
func CanSee(p tenant.Principal, t, parent string) bool {
	return p.Admin || p.Only == "" && !p.Admin && t == p.Tenant && (p.Scope == "" || parent == p.Scope)
}

// Resolve returns the id of sandbox ref as ctx's Principal sees it (an
// admin token names sandboxes by id only).
func (m *Manager) Resolve(ctx context.Context, ref string) (string, error) {
	if p := tenant.FromContext(ctx); p.Admin {
		m.mu.RLock()
		_, ok := m.boxes[ref]
		m.mu.RUnlock()
		if ok {
			return ref, nil
		}
	}
	b, err := m.lookup(ctx, ref)
	if err != nil {
		return "", err
	}
	return b.id, nil
}

// Observation is one box's identity, limits and usage at a sample.
type Observation struct {
	ID, Name, Tenant, Parent, Runtime string
	State                             sbxv1.SandboxState
	Resources                         runtime.Resources
	// Stats is zero when the driver could not measure (OK false).
	Stats runtime.Stats
	OK    bool
	// Network counters (zero without networking).
	NetRxBytes, NetTxBytes int64
}

// Counters is what the network offers a sampler: interface counters only
// (no conntrack walk, which costs O(all connections) per call).
type Counters interface {
	Counters(id string) (rx, tx int64, err error)
}

// Observe measures every sandbox that is running, stopped or failed, one
// after the other (the caller is one background sampler; driver Stats read
// a few cgroup files).
func (m *Manager) Observe(ctx context.Context) []Observation {
	m.mu.RLock()
	boxes := make([]*box, 0, len(m.boxes))
	for _, b := range m.boxes {
		boxes = append(boxes, b)
	}
	m.mu.RUnlock()
	nc, _ := m.cfg.Network.(Counters)
	out := make([]Observation, 0, len(boxes))
	for _, b := range boxes {
		if ctx.Err() != nil {
			break
		}
		b.mu.Lock()
		st, h := stateOf(b.rec.State), b.handle
		b.mu.Unlock()
		if st != sbxv1.SandboxState_SANDBOX_STATE_RUNNING && st != sbxv1.SandboxState_SANDBOX_STATE_STOPPED &&
			st != sbxv1.SandboxState_SANDBOX_STATE_FAILED {
			continue
		}
		r := b.spec().GetResources()
		o := Observation{ID: b.id, Name: b.spec().Name, Tenant: b.tenant, Parent: b.parent, Runtime: b.spec().Runtime, State: st,
			Resources: runtime.Resources{MemoryBytes: r.GetMemoryBytes(), CPUMillis: r.GetCpuMillis(), Pids: r.GetPids(), DiskBytes: r.GetDiskBytes()}}
		if st != sbxv1.SandboxState_SANDBOX_STATE_FAILED {
			if s, err := b.driver.Stats(ctx, h); err == nil {
				o.Stats, o.OK = s, true
			}
			if nc != nil {
				o.NetRxBytes, o.NetTxBytes, _ = nc.Counters(b.id)
			}
		}
		out = append(out, o)
	}
	return out
}

// PoolSize returns how many warm boxes are ready (0 without a pool).
func (m *Manager) PoolSize() int {
	if m.pool == nil {
		return 0
	}
	m.pool.mu.Lock()
	defer m.pool.mu.Unlock()
	return len(m.pool.idle)
}

// emitCreated publishes created and started for box id, just made
// (how: "cold" or "warm", from the pool).
func (m *Manager) emitCreated(id, how string) {
	m.mu.RLock()
	b, ok := m.boxes[id]
	m.mu.RUnlock()
	if ok {
		m.emit(b, sbxv1.EventType_EVENT_TYPE_CREATED, how, "")
		m.emit(b, sbxv1.EventType_EVENT_TYPE_STARTED, "", "")
	}
}

// emitDestroyed publishes b's destroy: reason is the destroy's text;
// failed says b had failed before (its destroy reason is then "failed"
// unless a timeout or its parent ended it).
func (m *Manager) emitDestroyed(b *box, reason string, failed bool) {
	word := destroyReason(reason)
	if failed && word == "user" {
		word = "failed"
	}
	m.emit(b, sbxv1.EventType_EVENT_TYPE_DESTROYED, word, reason)
}

// stopReason is the short reason word of a stop with detail detail (the
// idle timeout's; a user's stop has none).
func stopReason(detail string) string {
	if detail != "" {
		return "idle"
	}
	return "user"
}
