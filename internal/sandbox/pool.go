package sandbox

import (
	"context"
	"fmt"
	"slices"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/agentconn"
	"github.com/sbxdev/sbx/internal/network"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/store"
	"github.com/sbxdev/sbx/internal/tenant"
)

// The warm pool keeps Config.WarmPool boxes of the default runtime and the
// host image started and idle, so that a create only has to hand one over:
// set its limits (runtime.Updater), tell its agent the sandbox's env, workdir
// and command (Configure) and record it. Pool boxes are not in the database;
// after a crash the drivers' Cleanup removes them, and Close destroys them.

type warmBox struct {
	id     string
	handle runtime.Handle
	conn   *agentconn.Conn
	res    runtime.Resources
	net    network.Attachment // public; the claim sets the sandbox's policy
}

// poolSpec is what a warm box is started with.
func (m *Manager) poolSpec(id string) runtime.Spec {
	return runtime.Spec{
		ID:        id,
		Image:     runtime.Image{Name: "host"},
		Env:       []string{"SBX_SANDBOX_ID=" + id},
		Workdir:   "/",
		Hostname:  id,
		Resources: m.cfg.Defaults,
	}
}

// fillPool keeps the pool full until the manager closes.
func (m *Manager) fillPool() {
	defer m.wg.Done()
	drv := m.cfg.Drivers[m.cfg.DefaultRuntime]
	backoff := time.Second
	for {
		select {
		case <-m.stop:
			return
		case <-m.poolWake:
		}
		for len(m.pool) < cap(m.pool) {
			select {
			case <-m.stop:
				return
			default:
			}
			w, err := m.startWarm(drv)
			if err != nil {
				m.log.Warn("warm pool: starting a box failed", "err", err, "retry_in", backoff)
				select {
				case <-m.stop:
					return
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, 30*time.Second)
				continue
			}
			backoff = time.Second
			m.pool <- w
		}
	}
}

func (m *Manager) startWarm(drv runtime.Driver) (*warmBox, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*runtime.ProbeTimeout)
	defer cancel()
	id := newID()
	spec := m.poolSpec(id)
	att := network.Attachment{Policy: network.Policy{Mode: network.ModeNone}}
	if m.cfg.Network != nil {
		var err error
		if att, err = m.cfg.Network.Attach(ctx, id, network.Policy{Mode: network.ModePublic}); err != nil {
			return nil, err
		}
		spec.NetNS, spec.DNS = att.NetNS, att.DNS
	}
	h, err := drv.Create(ctx, spec)
	if err != nil {
		m.detachNetwork(ctx, id)
		return nil, err
	}
	w := &warmBox{id: id, handle: h, res: m.cfg.Defaults, net: att}
	w.conn = agentConn(drv, h)
	// The agent serves (the driver contract); connect now, off the claim's
	// path, and make sure it speaks our protocol.
	hctx, cancel := context.WithTimeout(ctx, runtime.ProbeTimeout)
	defer cancel()
	if _, err := w.conn.Hello(hctx); err != nil {
		m.destroyWarm(context.Background(), w, drv)
		return nil, err
	}
	return w, nil
}

// destroyWarm destroys a warm box and releases its network.
func (m *Manager) destroyWarm(ctx context.Context, w *warmBox, drv runtime.Driver) {
	w.conn.Close()
	if err := drv.Destroy(ctx, w.handle); err != nil {
		m.log.Warn("warm pool: destroying a box", "err", err)
	}
	m.detachNetwork(ctx, w.id)
}

// takeWarm returns a warm box suitable for spec, or nil.
func (m *Manager) takeWarm(spec *sbxv1.CreateSandboxRequest, drv runtime.Driver) *warmBox {
	// Domain secrets need a CA bundle mount, which a running box cannot get;
	// codebase layers are mounted before the box starts; a scoped token is
	// in the box's environment from its start: all cold create.
	if m.pool == nil || spec.Image != HostImage || spec.Runtime != m.cfg.DefaultRuntime || len(spec.Volumes) > 0 ||
		len(spec.DomainSecrets) > 0 || len(spec.Codebases) > 0 || spec.ScopedToken {
		return nil
	}
	if _, ok := drv.(runtime.Updater); !ok && toResources(spec.Resources) != m.cfg.Defaults {
		return nil
	}
	select {
	case w := <-m.pool:
		m.wakePool()
		return w
	default:
		m.wakePool()
		return nil
	}
}

func (m *Manager) wakePool() {
	select {
	case m.poolWake <- struct{}{}:
	default:
	}
}

func toResources(r *sbxv1.Resources) runtime.Resources {
	return runtime.Resources{MemoryBytes: r.GetMemoryBytes(), CPUMillis: r.GetCpuMillis(), Pids: r.GetPids(), DiskBytes: r.GetDiskBytes()}
}

// claimWarm turns warm box w into the sandbox described by spec. On error
// the box is destroyed and nothing is recorded; the caller falls back to a
// cold create.
func (m *Manager) claimWarm(ctx context.Context, w *warmBox, spec *sbxv1.CreateSandboxRequest, drv runtime.Driver, pol network.Policy) (*sbxv1.Sandbox, error) {
	b, rec, err := m.newBox(ctx, w.id, spec, drv)
	if err != nil {
		m.destroyWarm(context.WithoutCancel(ctx), w, drv)
		return nil, err
	}
	b.handle = w.handle
	b.conn = w.conn
	b.net = w.net
	if rec.Handle, err = marshalHandle(w.handle); err != nil {
		return nil, err
	}
	b.opMu.Lock()
	defer b.opMu.Unlock()
	if err := m.reserve(b, new(tenant.FromContext(ctx))); err != nil {
		// A name clash is the user's error, not the pool's: put the box back.
		select {
		case m.pool <- w:
		default:
			m.destroyWarm(context.WithoutCancel(ctx), w, drv)
		}
		return nil, err
	}
	if err := m.cfg.Store.Insert(ctx, rec); err != nil {
		m.forget(b.id, "")
		m.destroyWarm(context.WithoutCancel(ctx), w, drv)
		return nil, err
	}
	fail := func(err error) (*sbxv1.Sandbox, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		m.destroyWarm(cctx, w, drv)
		_ = m.cfg.Store.Delete(cctx, b.id)
		m.forget(b.id, "")
		return nil, err
	}
	if m.cfg.Network != nil && !samePolicy(pol, w.net.Policy) {
		// Rules are per box: setting them is all a claim needs.
		att, err := m.cfg.Network.Update(ctx, w.id, pol)
		if err != nil {
			return fail(fmt.Errorf("set network policy of warm box: %w", err))
		}
		b.mu.Lock()
		b.net = att
		b.mu.Unlock()
	}
	if want := toResources(spec.Resources); want != w.res {
		up, ok := drv.(runtime.Updater)
		if !ok {
			return fail(fmt.Errorf("runtime %s cannot change limits", drv.Name()))
		}
		if err := up.Update(ctx, w.handle, want); err != nil {
			return fail(fmt.Errorf("set limits of warm box: %w", err))
		}
	}
	if err := configure(ctx, w.conn, b.id, spec); err != nil {
		return fail(err)
	}
	if err := m.setState(ctx, b, sbxv1.SandboxState_SANDBOX_STATE_RUNNING, ""); err != nil {
		return fail(err)
	}
	m.log.Info("sandbox created", "sandbox", b.id, "name", spec.Name, "runtime", spec.Runtime, "warm", true)
	return m.toProto(b, nil), nil
}

func samePolicy(a, b network.Policy) bool {
	return a.Mode == b.Mode && a.APIAccess == b.APIAccess && slices.Equal(a.AllowCIDRs, b.AllowCIDRs) &&
		slices.Equal(a.AllowDomains, b.AllowDomains) && slices.Equal(a.DenyCIDRs, b.DenyCIDRs)
}

// drainPool destroys every idle warm box.
func (m *Manager) drainPool() {
	if m.pool == nil {
		return
	}
	drv := m.cfg.Drivers[m.cfg.DefaultRuntime]
	for {
		select {
		case w := <-m.pool:
			m.destroyWarm(context.Background(), w, drv)
		default:
			return
		}
	}
}

// newBox builds the in-memory box and its record for a sandbox about to be created.
func (m *Manager) newBox(ctx context.Context, id string, spec *sbxv1.CreateSandboxRequest, drv runtime.Driver) (*box, *store.Record, error) {
	now := nowMs()
	p := tenant.FromContext(ctx)
	b := &box{id: id, driver: drv, spec: spec, tenant: p.Tenant, parent: p.Scope}
	b.lastActive.Store(now)
	specJSON, err := protojsonMarshal(spec)
	if err != nil {
		return nil, nil, err
	}
	rec := &store.Record{
		ID: id, Name: spec.Name, State: stateName(sbxv1.SandboxState_SANDBOX_STATE_CREATING),
		Spec: specJSON, Labels: spec.Labels, CreatedAtMs: now, LastActiveAtMs: now,
		Tenant: b.tenant, Parent: b.parent,
	}
	if spec.ScopedToken {
		b.token = tenant.NewToken()
		b.tokenHash = tenant.HashToken(b.token)
		rec.ScopedTokenHash = b.tokenHash
	}
	if spec.TimeoutMs > 0 {
		rec.ExpiresAtMs = now + spec.TimeoutMs
	}
	b.rec = rec
	b.handle = runtime.Handle{ID: id, Driver: drv.Name()}
	return b, rec, nil
}
