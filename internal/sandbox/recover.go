package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/network"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/store"
)

type netConn = net.Conn

func marshalHandle(h runtime.Handle) ([]byte, error) {
	b, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encode handle of %s: %w", h.ID, err)
	}
	return b, nil
}

// recoverConcurrency is how many sandboxes Recover re-attaches at once.
const recoverConcurrency = 16

// Recover reconciles the database with reality after a (re)start: sandboxes
// whose boxes still run are re-attached, half-created or half-destroyed ones
// are finished off, dead ones are removed, and each driver then removes any
// host resource no record accounts for. Call it once, before serving.
func (m *Manager) Recover(ctx context.Context) error {
	if m.shared != nil {
		return m.recoverShared(ctx)
	}
	recs, err := m.cfg.Store.List(ctx)
	if err != nil {
		return err
	}
	keep := map[string]map[string]bool{}
	for name := range m.cfg.Drivers {
		keep[name] = map[string]bool{}
	}
	keepNet := map[string]bool{}
	// Boxes are re-attached recoverConcurrency at a time: each waits mostly
	// on its agent's Hello, and a restart must serve again within seconds
	// with a thousand boxes (issue 13).
	var mu sync.Mutex
	work := make(chan *store.Record)
	var wg sync.WaitGroup
	for range min(recoverConcurrency, len(recs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rec := range work {
				if m.recoverOne(ctx, rec) == dropped {
					continue
				}
				var h runtime.Handle
				_ = json.Unmarshal(rec.Handle, &h)
				mu.Lock()
				if keep[h.Driver] != nil {
					keep[h.Driver][rec.ID] = true
				}
				keepNet[rec.ID] = true
				mu.Unlock()
			}
		}()
	}
	for _, rec := range recs {
		work <- rec
	}
	close(work)
	wg.Wait()
	m.reapOrphans(ctx)
	if m.cfg.Network != nil {
		if err := m.cfg.Network.Cleanup(ctx, keepNet); err != nil {
			m.log.Error("cleaning up network leftovers", "err", err)
		}
	}
	if m.cfg.Codebases != nil {
		// After the drivers: no box may still use a layer being removed.
		defer func() {
			if err := m.cfg.Codebases.Cleanup(ctx, keepNet); err != nil {
				m.log.Error("cleaning up codebase mounts", "err", err)
			}
		}()
	}
	for name, drv := range m.cfg.Drivers {
		if err := drv.Cleanup(ctx, keep[name]); err != nil {
			m.log.Error("cleaning up leftovers", "runtime", name, "err", err)
		}
	}
	return nil
}

// recovery is what recoverOne did with a sandbox.
type recovery int

const (
	// dropped: the sandbox is gone (record deleted, box destroyed), or
	// only its record is kept (its runtime is missing).
	dropped recovery = iota
	// attached: the sandbox lives on in this daemon.
	attached
	// leftForNewer: a newer daemon made the box (its handle has a version
	// this one does not know, runtime.ErrHandleVersion): record, box and
	// network are left as they are for a daemon that understands them.
	leftForNewer
)

// recoverOne re-attaches one recorded sandbox.
func (m *Manager) recoverOne(ctx context.Context, rec *store.Record) recovery {
	log := m.log.With("sandbox", rec.ID)
	spec := &sbxv1.CreateSandboxRequest{}
	if err := protojson.Unmarshal(rec.Spec, spec); err != nil {
		log.Error("unreadable sandbox spec; removing the record", "err", err)
		_ = m.cfg.Store.Delete(ctx, rec.ID)
		return dropped
	}
	var h runtime.Handle
	if len(rec.Handle) > 0 {
		if err := json.Unmarshal(rec.Handle, &h); err != nil {
			log.Error("unreadable driver handle", "err", err)
		}
	}
	if h.ID == "" {
		h = runtime.Handle{ID: rec.ID, Driver: spec.Runtime}
	}
	drv, ok := m.cfg.Drivers[spec.Runtime]
	if !ok {
		log.Error("sandbox uses a runtime this daemon no longer has; keeping the record", "runtime", spec.Runtime)
		return dropped
	}
	drop := func(why string) recovery {
		if err := drv.Destroy(ctx, h); err != nil {
			log.Error("destroying leftover sandbox", "err", err)
		}
		m.detachNetwork(ctx, rec.ID)
		m.unmountCodebases(ctx, rec.ID)
		_ = m.cfg.Store.Delete(ctx, rec.ID)
		m.forget(rec.ID, why)
		log.Info("sandbox removed during recovery", "reason", why)
		return dropped
	}
	switch stateOf(rec.State) {
	case sbxv1.SandboxState_SANDBOX_STATE_RUNNING, sbxv1.SandboxState_SANDBOX_STATE_STOPPED:
	case sbxv1.SandboxState_SANDBOX_STATE_CREATING:
		return drop("daemon stopped while the sandbox was being created")
	default:
		why := "daemon stopped while the sandbox was " + rec.State
		if rec.StateDetail != "" {
			why += " (" + rec.StateDetail + ")"
		}
		return drop(why)
	}
	// An init that died while the daemon was down leaves the sandbox
	// failed, saying so, rather than silently gone (drv.Recover would
	// destroy the box): its resources stay until it is destroyed.
	dead, exit := initExited(ctx, drv, h)
	nh := h
	if !dead {
		var err error
		if nh, err = drv.Recover(ctx, h); err != nil {
			if errors.Is(err, runtime.ErrHandleVersion) {
				log.Error("sandbox made by a newer sbx daemon; leaving it and its record for one that understands it", "err", err)
				return leftForNewer
			}
			if errdefs.IsNotFound(err) {
				return drop("found dead after daemon restart")
			}
			return drop("could not re-attach after daemon restart: " + err.Error())
		}
	}
	var err error
	att := network.Attachment{Policy: network.Policy{Mode: network.ModeNone}}
	if info := drv.Info(ctx); info.Has(runtime.CapPodNetwork) && !info.Has(runtime.CapNetwork) {
		// The driver enforces the policy the box was created with, which
		// its spec records; the daemon's network has nothing of it.
		if pol, err := policyOf(spec.GetNetwork()); err == nil {
			att.Policy = pol
		}
	} else if m.cfg.Network != nil {
		if att, err = m.cfg.Network.Recover(ctx, rec.ID, m.domainSecrets(rec.ID, spec)); err != nil {
			if !errdefs.IsNotFound(err) {
				return drop("could not re-attach its network: " + err.Error())
			}
			// Created while networking was off: it has loopback only.
			att = network.Attachment{Policy: network.Policy{Mode: network.ModeNone}}
		}
	}
	b := &box{id: rec.ID, driver: drv, rec: rec, handle: nh, net: att,
		tenant: rec.Tenant, parent: rec.Parent, tokenHash: rec.ScopedTokenHash}
	b.specp.Store(spec)
	b.lastActive.Store(max(rec.LastActiveAtMs, rec.CreatedAtMs))
	if st, err := drv.Stats(ctx, nh); err == nil {
		b.oomSeen.Store(st.OOMKills) // kills before the restart are not news
	}
	if le, ok := drv.(runtime.LimitEventer); ok {
		if ev, err := le.LimitEvents(ctx, nh); err == nil {
			b.entryBase = ev // nor for the box's own command
		}
	}
	b.conn = m.agentConn(drv, nh)
	if dead {
		if err := m.reserve(b, nil); err != nil {
			b.conn.Close()
			return drop("name clash during recovery: " + err.Error())
		}
		m.agentExited(b, "agent died while the daemon was down", exit, false)
		return attached
	}
	if stateOf(rec.State) == sbxv1.SandboxState_SANDBOX_STATE_RUNNING {
		hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := b.conn.Hello(hctx)
		cancel()
		if err != nil {
			// A box recorded running may be frozen: the daemon died
			// between freezing it for a codebase sync and thawing it.
			// Thaw (idempotent) and ask again before giving up on it.
			if rerr := drv.Resume(ctx, nh); rerr == nil {
				hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err = b.conn.Hello(hctx)
				cancel()
				if err == nil {
					log.Info("thawed a sandbox left frozen by the crash")
				}
			}
		}
		if err != nil {
			b.conn.Close()
			return drop("agent did not answer after daemon restart: " + err.Error())
		}
	}
	if err := m.reserve(b, nil); err != nil {
		b.conn.Close()
		return drop("name clash during recovery: " + err.Error())
	}
	log.Info("sandbox re-attached", "state", rec.State)
	m.watch(b, "agent died")
	return attached
}

// initExited reports whether the init of box h is gone already, for
// drivers that can tell (runtime.Watcher).
func initExited(ctx context.Context, drv runtime.Driver, h runtime.Handle) (bool, runtime.Exit) {
	w, ok := drv.(runtime.Watcher)
	if !ok {
		return false, runtime.Exit{}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the driver's watch
	ch, err := w.Watch(ctx, h)
	if err != nil {
		return false, runtime.Exit{}
	}
	select {
	case ex, ok := <-ch:
		return ok, ex
	default:
		return false, runtime.Exit{}
	}
}

// Run starts the background loop that enforces lifetimes and idle timeouts
// and persists activity times. Close stops it.
func (m *Manager) Run() {
	if m.pool != nil {
		m.wg.Add(1)
		go m.fillPool()
		m.pool.wakeUp()
	}
	if m.shared != nil {
		m.wg.Add(1)
		go m.sweepShared()
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		tick := time.NewTicker(m.cfg.TickInterval)
		defer tick.Stop()
		lastFlush := time.Now()
		for {
			select {
			case <-m.stop:
				m.flushActivity(context.Background())
				return
			case <-tick.C:
			}
			m.enforceTimeouts()
			if time.Since(lastFlush) > 5*time.Second {
				m.flushActivity(context.Background())
				lastFlush = time.Now()
			}
		}
	}()
}

// Close stops the background loops, destroys the idle warm boxes and waits
// for the teardowns of destroyed sandboxes. Sandboxes keep running: a
// restarted daemon re-attaches them.
func (m *Manager) Close() {
	m.stopOnce.Do(func() { close(m.stop) })
	m.closePool()
	m.wg.Wait()
	m.closeTeardowns()
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, b := range m.boxes {
		b.mu.Lock()
		if b.conn != nil {
			b.conn.Close()
		}
		b.mu.Unlock()
	}
}

func (m *Manager) enforceTimeouts() {
	now := nowMs()
	m.mu.RLock()
	var expired, idle []*box
	for _, b := range m.boxes {
		b.mu.Lock()
		st, exp := stateOf(b.rec.State), b.rec.ExpiresAtMs
		b.mu.Unlock()
		// A failed box (its agent died) still holds its resources until
		// destroyed: its lifetime ends it like any other.
		if st != sbxv1.SandboxState_SANDBOX_STATE_RUNNING && st != sbxv1.SandboxState_SANDBOX_STATE_STOPPED &&
			st != sbxv1.SandboxState_SANDBOX_STATE_FAILED {
			continue
		}
		switch {
		case exp > 0 && now >= exp:
			expired = append(expired, b)
		case st == sbxv1.SandboxState_SANDBOX_STATE_RUNNING && b.spec().IdleTimeoutMs > 0 &&
			b.busy.Load() == 0 && now-b.lastActive.Load() >= b.spec().IdleTimeoutMs:
			idle = append(idle, b)
		}
	}
	m.mu.RUnlock()
	ctx := context.Background()
	for _, b := range expired {
		go func() {
			if err := m.destroyExpired(ctx, b); err != nil {
				m.log.Error("destroying expired sandbox", "sandbox", b.id, "err", err)
			}
		}()
	}
	for _, b := range idle {
		// Mark active so the next tick does not fire again while this runs.
		b.lastActive.Store(now)
		go func() {
			if err := m.idleOut(ctx, b); err != nil && !errdefs.IsFailedPrecondition(err) {
				m.log.Error("idle action", "sandbox", b.id, "err", err)
			}
		}()
	}
}

// idleOut applies b's idle action unless an operation began since the
// reaper's look (Agent counts it busy before it starts a stopped box).
func (m *Manager) idleOut(ctx context.Context, b *box) error {
	b.opMu.Lock()
	defer b.opMu.Unlock()
	if b.busy.Load() > 0 {
		return nil
	}
	if b.spec().IdleAction == sbxv1.IdleAction_IDLE_ACTION_STOP {
		return m.stopLocked(ctx, b, "idle timeout reached")
	}
	return m.destroyLocked(ctx, b, "idle timeout reached")
}

// destroyExpired destroys b if its deadline has passed, looking again under
// its opMu: an UpdateSandbox that moved the deadline after the reaper's
// look (it holds opMu) wins.
func (m *Manager) destroyExpired(ctx context.Context, b *box) error {
	b.opMu.Lock()
	defer b.opMu.Unlock()
	b.mu.Lock()
	exp := b.rec.ExpiresAtMs
	b.mu.Unlock()
	if exp == 0 || nowMs() < exp {
		return nil
	}
	return m.destroyLocked(ctx, b, "lifetime timeout reached")
}

func (m *Manager) flushActivity(ctx context.Context) {
	m.mu.RLock()
	dirty := map[string]int64{}
	for id, b := range m.boxes {
		if b.dirty.Swap(false) {
			dirty[id] = b.lastActive.Load()
		}
	}
	m.mu.RUnlock()
	if err := m.cfg.Store.TouchMany(ctx, dirty); err != nil {
		m.log.Warn("persisting activity times", "err", err)
	}
}
