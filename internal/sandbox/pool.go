package sandbox

import (
	"context"
	"fmt"
	goruntime "runtime"
	"slices"
	"sync"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/agentconn"
	"github.com/sbxdev/sbx/internal/crashpoint"
	"github.com/sbxdev/sbx/internal/network"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/store"
	"github.com/sbxdev/sbx/internal/tenant"
)

// The warm pool keeps started, idle boxes of the default runtime and the
// host image with default limits, so that a create only has to hand one
// over: set its limits (runtime.Updater), tell its agent the sandbox's env,
// workdir and command (Configure) and record it. Pool boxes are not in the
// database; after a crash the drivers' Cleanup removes them, and Close
// destroys them.
//
// The pool is adaptive: it holds at least Config.WarmPool boxes and grows
// toward the demand it has seen (creates that could take a warm box within
// the last demandWindow) up to Config.WarmPoolMax, so that a burst of
// concurrent clients is served warm; after shrinkAfter without such a
// create it halves its target (never below the floor) and destroys the
// excess, so it does not hold memory nobody uses. Refills run in the
// background, as many at once as the pool is short of its target, up to
// refillMax (twice the CPUs) less the creates in flight that found no warm
// box and so make theirs cold: refills use what the creates they serve
// leave of the machine, never starve them, and at least one runs while the
// pool is short, so that it catches up once demand falls. A create that
// finds the pool empty while a refill nobody waits for is in flight waits
// for that box (at most refillWait) instead of making its own cold: on a
// small machine a cold create beside the refills only splits the same CPU
// between more boxes, so under sustained demand nearly every create was
// cold. Close cancels refills in flight, sends the waiters away empty and
// destroys every box a refill hands in after it, so a graceful stop leaves
// no warm box running however it races a refill.

const (
	demandWindow = time.Second
	shrinkAfter  = 30 * time.Second
	// refillWait bounds how long a create waits for a refill in flight
	// before it makes its box cold.
	refillWait = 2 * time.Second
)

// defaultRefillMax is the most refills at once: twice the CPUs (a create
// waits on its agent and runtime part of the time), at least 2.
var defaultRefillMax = max(2, 2*goruntime.NumCPU())

// DefaultWarmPoolMax is the warm pool's ceiling when Config.WarmPoolMax is 0.
const DefaultWarmPoolMax = 16

type warmBox struct {
	id     string
	handle runtime.Handle
	conn   *agentconn.Conn
	res    runtime.Resources
	net    network.Attachment // public; the claim sets the sandbox's policy
}

// warmPool is the pool's state. min and max are immutable.
type warmPool struct {
	min, max int
	// refillMax bounds refills and cold creates in flight together.
	refillMax int
	// wake nudges the filler.
	wake chan struct{}
	// ctx is cancelled by Close: refills in flight give up.
	ctx    context.Context
	cancel context.CancelFunc
	// shrinkAfter is how long the pool waits without demand before it
	// halves its target (a field so tests can shorten it).
	shrinkAfter time.Duration

	mu sync.Mutex
	// The fields below are guarded by mu.
	idle     []*warmBox // oldest first
	starting int        // refills in flight
	target   int        // boxes the pool aims to hold: min ≤ target ≤ max
	closed   bool
	// waiters are creates waiting for a refill in flight, first come
	// first served; each channel (buffered, 1) gets a box, or nil when
	// the refill failed or the pool closed. There are never more waiters
	// than refills in flight.
	waiters []chan *warmBox
	// takes are the times of recent creates that could take a warm box
	// (within demandWindow); lastTake is the latest, lastShrink when the
	// target last shrank.
	takes []time.Time
	// active counts pool-eligible creates in flight: a burst of clients
	// whose creates reach the pool spread over more than demandWindow (a
	// loaded host) still shows as that many at once.
	active int
	// cold counts the pool-eligible creates in flight that found no warm
	// box: refills give way to them.
	cold       int
	lastTake   time.Time
	lastShrink time.Time
	backoff    time.Duration
	retryAt    time.Time
}

func newWarmPool(min, max int) *warmPool {
	ctx, cancel := context.WithCancel(context.Background())
	return &warmPool{min: min, max: max, refillMax: defaultRefillMax, target: min, wake: make(chan struct{}, 1), ctx: ctx, cancel: cancel,
		shrinkAfter: shrinkAfter, backoff: time.Second}
}

func (p *warmPool) wakeUp() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// demandLocked records a create that could take a warm box and raises the
// target to the creates seen within demandWindow.
func (p *warmPool) demandLocked(now time.Time) {
	i := 0
	for i < len(p.takes) && now.Sub(p.takes[i]) > demandWindow {
		i++
	}
	p.takes = append(p.takes[i:], now)
	if len(p.takes) > p.max {
		p.takes = p.takes[len(p.takes)-p.max:]
	}
	p.lastTake = now
	p.target = max(p.target, min(max(len(p.takes), p.active), p.max))
}

// shrinkLocked halves the target after shrinkAfter without demand and
// returns the idle boxes beyond it (oldest first) for the caller to destroy.
func (p *warmPool) shrinkLocked(now time.Time) []*warmBox {
	if p.target <= p.min || now.Sub(p.lastTake) < p.shrinkAfter || now.Sub(p.lastShrink) < p.shrinkAfter {
		return nil
	}
	p.target = max(p.min, p.target/2)
	p.lastShrink = now
	if excess := len(p.idle) - p.target; excess > 0 {
		out := slices.Clone(p.idle[:excess])
		p.idle = slices.Delete(p.idle, 0, excess)
		return out
	}
	return nil
}

// poolSpec is what a warm box is started with.
func (m *Manager) poolSpec(id string) runtime.Spec {
	return runtime.Spec{
		ID:        id,
		Image:     runtime.Image{Ref: HostImage, Host: &runtime.HostImage{}},
		Env:       []string{"SBX_SANDBOX_ID=" + id},
		Workdir:   "/",
		Hostname:  id,
		Resources: m.cfg.Defaults,
	}
}

// refillsLocked is how many more refills may start now: as many as the
// pool is short of its target, within refillMax less the cold creates in
// flight (at least one refill in flight while short).
func (p *warmPool) refillsLocked() int {
	short := p.target - len(p.idle) - p.starting
	room := max(1, p.refillMax-p.cold) - p.starting
	return max(0, min(short, room))
}

// fillPool keeps the pool at its target until Close, starting boxes in
// the background (see refillsLocked) and shrinking it when demand stops.
func (m *Manager) fillPool() {
	defer m.wg.Done()
	p := m.pool
	drv := m.cfg.Drivers[m.cfg.DefaultRuntime]
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-p.wake:
		case <-tick.C:
		}
		now := time.Now()
		p.mu.Lock()
		excess := p.shrinkLocked(now)
		n := 0
		if !p.closed && !now.Before(p.retryAt) {
			n = p.refillsLocked()
		}
		p.starting += n
		p.mu.Unlock()
		for _, w := range excess {
			m.destroyWarm(context.Background(), w, drv)
		}
		for range n {
			m.wg.Add(1)
			go m.refill(drv)
		}
	}
}

// refill starts one warm box and hands it to the pool, or destroys it if
// the pool closed meanwhile.
func (m *Manager) refill(drv runtime.Driver) {
	defer m.wg.Done()
	p := m.pool
	w, err := m.startWarm(p.ctx, drv)
	p.mu.Lock()
	p.starting--
	if err != nil {
		if !p.closed {
			m.log.Warn("warm pool: starting a box failed", "err", err, "retry_in", p.backoff)
		}
		p.retryAt = time.Now().Add(p.backoff)
		p.backoff = min(2*p.backoff, 30*time.Second)
	} else {
		p.backoff = time.Second
	}
	handed := false
	if len(p.waiters) > 0 {
		// The first waiter takes the box, or learns that there is none.
		p.waiters[0] <- w
		p.waiters = slices.Delete(p.waiters, 0, 1)
		handed, w = err == nil, nil
	} else if err == nil && !p.closed {
		p.idle = append(p.idle, w)
		w = nil
	}
	idle := len(p.idle)
	p.mu.Unlock()
	switch {
	case handed:
		m.log.Info("warm pool: box taken", "idle", idle)
	case err == nil && w == nil:
		// What `sbx-bench -only scale` waits for between bursts.
		m.log.Info("warm pool: box ready", "idle", idle)
	}
	if w != nil {
		m.destroyWarm(context.Background(), w, drv)
	}
	p.wakeUp()
}

func (m *Manager) startWarm(ctx context.Context, drv runtime.Driver) (*warmBox, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*runtime.ProbeTimeout)
	defer cancel()
	id := newID()
	spec := m.poolSpec(id)
	att := network.Attachment{Policy: network.Policy{Mode: network.ModeNone}}
	if m.cfg.Network != nil && drv.Info(ctx).Has(runtime.CapNetwork) {
		var err error
		if att, err = m.cfg.Network.Attach(ctx, id, network.Policy{Mode: network.ModePublic}); err != nil {
			m.detachNetwork(context.Background(), id)
			return nil, err
		}
		spec.Network = netAttachment(att)
	}
	h, err := drv.Create(ctx, spec)
	if err != nil {
		// The driver rolled its part back; a create cut off by Close may
		// still have left something: Destroy is idempotent.
		_ = drv.Destroy(context.Background(), runtime.Handle{ID: id, Driver: drv.Name()})
		m.detachNetwork(context.Background(), id)
		return nil, err
	}
	crashpoint.Pause(ctx, "warm-started", id)
	w := &warmBox{id: id, handle: h, res: m.cfg.Defaults, net: att}
	w.conn = m.agentConn(drv, h)
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

// takeWarm returns a warm box suitable for spec, or nil, and a func the
// create calls when it ends (it counts toward the pool's demand until then).
func (m *Manager) takeWarm(ctx context.Context, spec *sbxv1.CreateSandboxRequest, drv runtime.Driver, pol network.Policy) (*warmBox, func()) {
	// Domain secrets need a CA bundle mount, which a running box cannot get;
	// codebase layers are mounted before the box starts; a scoped token is
	// in the box's environment from its start: all cold create.
	if m.pool == nil || spec.Image != HostImage || spec.Runtime != m.cfg.DefaultRuntime || len(spec.Volumes) > 0 ||
		len(spec.DomainSecrets) > 0 || len(spec.Codebases) > 0 || spec.ScopedToken {
		return nil, func() {}
	}
	// Warm boxes start connected: one can become a box with network mode
	// none only on a runtime whose boxes drop an interface in place.
	if info := drv.Info(ctx); m.cfg.Network != nil && info.Has(runtime.CapNetwork) &&
		pol.Mode == network.ModeNone && !info.Has(runtime.CapNetworkReplug) {
		return nil, func() {}
	}
	// A box's pod policy is written when it starts.
	if info := drv.Info(ctx); info.Has(runtime.CapPodNetwork) && !info.Has(runtime.CapNetwork) && pol.Mode != network.ModeNone {
		return nil, func() {}
	}
	if _, ok := drv.(runtime.Updater); !ok && toResources(spec.Resources) != m.cfg.Defaults {
		return nil, func() {}
	}
	p := m.pool
	p.mu.Lock()
	var w *warmBox
	var wait chan *warmBox
	p.active++
	if !p.closed {
		p.demandLocked(time.Now())
		switch {
		case len(p.idle) > 0:
			w = p.idle[0]
			p.idle = slices.Delete(p.idle, 0, 1)
		case p.starting > len(p.waiters):
			// A refill nobody waits for is in flight: wait for its box.
			wait = make(chan *warmBox, 1)
			p.waiters = append(p.waiters, wait)
		}
	}
	if wait != nil {
		p.mu.Unlock()
		w = m.awaitRefill(ctx, wait, drv)
		p.mu.Lock()
	}
	cold := w == nil
	if cold {
		p.cold++
	}
	done := func() {
		p.mu.Lock()
		p.active--
		if cold {
			p.cold--
		}
		p.mu.Unlock()
		if cold {
			p.wakeUp() // room for a refill
		}
	}
	idle := len(p.idle)
	p.mu.Unlock()
	p.wakeUp()
	if w != nil && wait == nil {
		m.log.Info("warm pool: box taken", "idle", idle)
	}
	return w, done
}

// awaitRefill waits for the box a refill hands to wait, for at most
// refillWait or until ctx ends; nil means the create goes cold. A box that
// comes after the wait ended goes back to the pool.
func (m *Manager) awaitRefill(ctx context.Context, wait chan *warmBox, drv runtime.Driver) *warmBox {
	t := time.NewTimer(refillWait)
	defer t.Stop()
	select {
	case w := <-wait:
		return w
	case <-ctx.Done():
	case <-t.C:
	}
	p := m.pool
	p.mu.Lock()
	i := slices.Index(p.waiters, wait)
	if i >= 0 {
		p.waiters = slices.Delete(p.waiters, i, i+1)
	}
	p.mu.Unlock()
	if i < 0 {
		// Handed a box (or nil) just as the wait ended.
		if w := <-wait; w != nil {
			m.putBackWarm(context.WithoutCancel(ctx), w, drv)
		}
	}
	return nil
}

// putBackWarm returns an unused warm box to the pool, or destroys it if
// the pool is closed or full.
func (m *Manager) putBackWarm(ctx context.Context, w *warmBox, drv runtime.Driver) {
	p := m.pool
	p.mu.Lock()
	keep := !p.closed && (len(p.waiters) > 0 || len(p.idle) < p.max)
	switch {
	case keep && len(p.waiters) > 0:
		p.waiters[0] <- w
		p.waiters = slices.Delete(p.waiters, 0, 1)
	case keep:
		p.idle = append(p.idle, w)
	}
	p.mu.Unlock()
	if !keep {
		m.destroyWarm(ctx, w, drv)
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
	m.refreshName(ctx, b.tenant, spec.Name)
	if err := m.reserve(b, new(tenant.FromContext(ctx))); err != nil {
		// A name clash is the user's error, not the pool's: put the box back.
		m.putBackWarm(context.WithoutCancel(ctx), w, drv)
		return nil, err
	}
	if err := m.admitShared(ctx, b, new(tenant.FromContext(ctx))); err != nil {
		m.forget(b.id, "")
		m.putBackWarm(context.WithoutCancel(ctx), w, drv)
		return nil, err
	}
	// The record is written once, running, after the box is set up: a
	// crash before that leaves a started box no record accounts for, which
	// the driver's Cleanup removes at the next start like any warm box.
	fail := func(err error) (*sbxv1.Sandbox, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		m.destroyWarm(cctx, w, drv)
		m.forget(b.id, "")
		m.unreserveShared(cctx, b)
		return nil, err
	}
	if m.cfg.Network != nil && drv.Info(ctx).Has(runtime.CapNetwork) && !samePolicy(pol, w.net.Policy) {
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
	if err := configure(ctx, w.conn, runtimeSpec(b.id, spec, nil).Env, spec); err != nil {
		return fail(err)
	}
	b.mu.Lock()
	rec.State = stateName(sbxv1.SandboxState_SANDBOX_STATE_RUNNING)
	b.mu.Unlock()
	if err := m.cfg.Store.Insert(ctx, rec); err != nil {
		return fail(err)
	}
	m.watch(b, "agent died")
	m.log.Info("sandbox created", "sandbox", b.id, "name", spec.Name, "runtime", spec.Runtime, "warm", true)
	return m.toProto(b, nil), nil
}

func samePolicy(a, b network.Policy) bool {
	return a.Mode == b.Mode && a.APIAccess == b.APIAccess && slices.Equal(a.AllowCIDRs, b.AllowCIDRs) &&
		slices.Equal(a.AllowDomains, b.AllowDomains) && slices.Equal(a.DenyCIDRs, b.DenyCIDRs)
}

// closePool stops refills (cancelling those in flight) and destroys every
// idle warm box; call it after the filler goroutines have ended or
// concurrently with them: a refill that ends after the pool closed destroys
// its box itself.
func (m *Manager) closePool() {
	if m.pool == nil {
		return
	}
	p := m.pool
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	for _, wait := range p.waiters {
		wait <- nil // go cold (and meet the closing daemon there)
	}
	p.waiters = nil
	p.mu.Unlock()
	p.cancel()
	drv := m.cfg.Drivers[m.cfg.DefaultRuntime]
	for _, w := range idle {
		m.destroyWarm(context.Background(), w, drv)
	}
}

// newBox builds the in-memory box and its record for a sandbox about to be created.
func (m *Manager) newBox(ctx context.Context, id string, spec *sbxv1.CreateSandboxRequest, drv runtime.Driver) (*box, *store.Record, error) {
	now := nowMs()
	p := tenant.FromContext(ctx)
	b := &box{id: id, driver: drv, tenant: p.Tenant, parent: p.Scope}
	b.specp.Store(spec)
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
