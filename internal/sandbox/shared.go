package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/network"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/store"
	"github.com/sbxdev/sbx/internal/tenant"
)

// Store is where the manager keeps its sandbox records: internal/store's
// SQLite file (one daemon) or a shared backend (SharedStore). Records are
// kept verbatim; the manager gives them their meaning.
type Store interface {
	// Insert adds a new record; a duplicate id or a name its tenant
	// already uses wraps errdefs.ErrAlreadyExists.
	Insert(ctx context.Context, r *store.Record) error
	// Update rewrites state, handle, detail and timestamps.
	Update(ctx context.Context, r *store.Record) error
	// UpdateSpec rewrites spec, labels and deadline.
	UpdateSpec(ctx context.Context, r *store.Record) error
	// MarkDestroying records the destroy's start and releases the name.
	MarkDestroying(ctx context.Context, r *store.Record) error
	// TouchMany records last-activity times.
	TouchMany(ctx context.Context, lastActive map[string]int64) error
	// Delete removes a record; a missing one is not an error.
	Delete(ctx context.Context, id string) error
	// Get returns a record by id (errdefs.ErrNotFound if none).
	Get(ctx context.Context, id string) (*store.Record, error)
	// List returns every record, oldest first.
	List(ctx context.Context) ([]*store.Record, error)
}

// SharedStore is a Store that several daemons (replicas) use at once
// (internal/store/kubestore). With one, the manager's memory is a cache of
// the store, which is the truth: every lookup reads the record, a sandbox
// another replica made is adopted on first use, one another replica
// destroyed is dropped, and a sweep (sharedSweepInterval) adopts every
// record so that lifetimes and idle timeouts hold whichever replica made
// the sandbox. Its writes must be atomic read-check-writes that refuse to
// change a record marked destroying (wrapping errdefs.ErrNotFound), so that
// exactly one replica wins a destroy.
type SharedStore interface {
	Store
	// ByName returns the record holding tenant's name.
	ByName(ctx context.Context, tenant, name string) (*store.Record, error)
}

// UsageLedger is a SharedStore that also keeps, per tenant, what each of
// its sandboxes holds (kubestore), so that replicas admit creates against a
// tenant's quotas together: each replica's memory sees the others'
// sandboxes only at its next sweep, so two replicas counting in memory
// could together admit more than the quota. Marking a record destroying
// (and deleting it) takes its sandbox out of the ledger.
type UsageLedger interface {
	// Reserve sets sandbox id's usage u in tenant's ledger, as an atomic
	// read-check-write: check is given what the tenant's other sandboxes
	// hold, and its error refuses (and is returned; nothing is written).
	Reserve(ctx context.Context, tenantName, id string, u tenant.Usage, check func(others tenant.Usage) error) error
	// Unreserve takes sandbox id out of tenant's ledger.
	Unreserve(ctx context.Context, tenantName, id string) error
	// ReconcileUsage brings the ledgers in line with the records a sweep
	// listed (tenant → id → usage), keeping entries younger than grace
	// that have no record (creates in flight).
	ReconcileUsage(ctx context.Context, held map[string]map[string]tenant.Usage, grace time.Duration) error
}

// ledgerGrace is how long a ledger entry without a record counts as a
// create in flight: a create reserves before it writes its record. It is
// far above the time between the two writes; an entry a killed replica
// left counts against its tenant until then.
const ledgerGrace = time.Minute

// admitShared reserves b's usage in its tenant's ledger, checked against
// p's quotas, when the store keeps one.
func (m *Manager) admitShared(ctx context.Context, b *box, p *tenant.Principal) error {
	if m.ledger == nil {
		return nil
	}
	u := usageOf(b)
	return m.ledger.Reserve(ctx, b.tenant, b.id, u, func(others tenant.Usage) error {
		return p.Quotas.Admit(b.tenant, others, u)
	})
}

// unreserveShared takes b back out of its tenant's ledger after a create
// that wrote no record failed.
func (m *Manager) unreserveShared(ctx context.Context, b *box) {
	if m.ledger == nil {
		return
	}
	if err := m.ledger.Unreserve(context.WithoutCancel(ctx), b.tenant, b.id); err != nil {
		m.log.Warn("taking a failed create out of its tenant's usage ledger (the sweep retries)", "sandbox", b.id, "err", err)
	}
}

// reconcileUsage brings the ledgers in line with recs, every record.
func (m *Manager) reconcileUsage(ctx context.Context, recs []*store.Record) error {
	if m.ledger == nil {
		return nil
	}
	held := map[string]map[string]tenant.Usage{}
	for _, rec := range recs {
		if stateOf(rec.State) == sbxv1.SandboxState_SANDBOX_STATE_DESTROYING {
			continue // counts against no quota
		}
		spec := &sbxv1.CreateSandboxRequest{}
		if err := protojson.Unmarshal(rec.Spec, spec); err != nil {
			continue
		}
		if held[rec.Tenant] == nil {
			held[rec.Tenant] = map[string]tenant.Usage{}
		}
		held[rec.Tenant][rec.ID] = usageOfSpec(spec)
	}
	return m.ledger.ReconcileUsage(ctx, held, ledgerGrace)
}

const (
	// sharedSweepInterval is how often a replica re-reads every record.
	sharedSweepInterval = 5 * time.Second
)

const (
	// DefaultCreatingGrace is how long a record may stay creating before a
	// replica that is not creating it removes it, and destroys its box, as
	// a dead replica's leftover (Config.CreatingGrace). It is far above
	// any create (image pull and pod start included) and assumes replicas'
	// clocks agree within it.
	DefaultCreatingGrace = 10 * time.Minute
	// DefaultTeardownGrace is how long a record may stay destroying before
	// another replica finishes the teardown of the replica that began it,
	// which was killed or whose teardown is failing (Config.TeardownGrace).
	DefaultTeardownGrace = 2 * time.Minute
)

// lookupShared resolves ref through the shared store, bringing memory up
// to date with what it finds, then answers from memory as lookup does.
func (m *Manager) lookupShared(ctx context.Context, ref string) (*box, error) {
	p := tenant.FromContext(ctx)
	var rec *store.Record
	var err error
	if IsID(ref) {
		rec, err = m.shared.Get(ctx, ref)
	} else {
		rec, err = m.shared.ByName(ctx, p.Tenant, ref)
	}
	switch {
	case errdefs.IsNotFound(err):
		m.dropStaleRef(p.Tenant, ref)
	case err != nil:
		return nil, fmt.Errorf("look up sandbox %q: %w", ref, err)
	default:
		if err := m.syncRecord(ctx, rec); err != nil {
			return nil, err
		}
	}
	return m.lookupLocal(ctx, ref)
}

// dropStaleRef forgets the box that ref names in memory, if any: the
// store no longer has it (another replica destroyed it).
func (m *Manager) dropStaleRef(tenantName, ref string) {
	m.mu.RLock()
	b, ok := m.boxes[ref]
	if !ok {
		if id, named := m.names[nameKey(tenantName, ref)]; named {
			b, ok = m.boxes[id]
		}
	}
	m.mu.RUnlock()
	if ok && b.persisted() && !b.creatingHere() {
		m.dropStale(b, "destroyed through another replica")
	}
}

// persisted reports whether b's record has been in the shared store as
// this replica knows (it wrote or read a version of it): only then does
// the record's absence mean that another replica destroyed b. A warm box
// being handed over is registered, running, before its record is written.
func (b *box) persisted() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rec.Version != ""
}

// creatingHere reports whether b is being created by this replica (its
// record may not be written yet).
func (b *box) creatingHere() bool {
	return b.state() == sbxv1.SandboxState_SANDBOX_STATE_CREATING
}

// dropStale forgets b, which another replica destroyed: its connection
// closes, its watch ignores the agent's end, and the replica that
// destroyed it tears it down.
func (m *Manager) dropStale(b *box, reason string) {
	b.mu.Lock()
	rec := *b.rec
	rec.State = stateName(sbxv1.SandboxState_SANDBOX_STATE_DESTROYING)
	rec.StateDetail = reason
	b.rec = &rec
	conn := b.conn
	b.conn = nil
	b.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
	m.forget(b.id, reason)
}

// syncRecord brings memory in line with rec, read from the shared store:
// a box not in memory is adopted, one whose record changed is refreshed,
// one marked destroying is dropped. A record being created by another
// replica is answered as not running yet.
func (m *Manager) syncRecord(ctx context.Context, rec *store.Record) error {
	m.mu.RLock()
	b, ok := m.boxes[rec.ID]
	m.mu.RUnlock()
	st := stateOf(rec.State)
	switch {
	case st == sbxv1.SandboxState_SANDBOX_STATE_DESTROYING || st == sbxv1.SandboxState_SANDBOX_STATE_DESTROYED:
		if ok {
			m.dropStale(b, "destroyed through another replica: "+rec.StateDetail)
		}
		return nil
	case ok:
		return m.refresh(b, rec)
	case st == sbxv1.SandboxState_SANDBOX_STATE_CREATING:
		return fmt.Errorf("sandbox %s is being created by another replica: %w", rec.ID, errdefs.ErrFailedPrecondition)
	}
	return m.adopt(ctx, rec)
}

// refresh takes a newer version of b's record (another replica stopped,
// started, updated or failed b).
func (m *Manager) refresh(b *box, rec *store.Record) error {
	b.mu.Lock()
	same := b.rec.Version == rec.Version
	b.mu.Unlock()
	if same || b.creatingHere() {
		return nil
	}
	spec := &sbxv1.CreateSandboxRequest{}
	if err := protojson.Unmarshal(rec.Spec, spec); err != nil {
		return fmt.Errorf("decode spec of sandbox %s: %w", rec.ID, err)
	}
	m.mu.Lock()
	// UpdateSandbox may change labels and limits; names never change.
	b.specp.Store(spec)
	m.mu.Unlock()
	b.mu.Lock()
	if b.rec.Version != rec.Version {
		b.rec = rec
	}
	b.mu.Unlock()
	if rec.LastActiveAtMs > b.lastActive.Load() {
		b.lastActive.Store(rec.LastActiveAtMs)
	}
	return nil
}

// adopt takes into memory a sandbox another replica made (or this one,
// before a restart), without touching its box: unlike recovery, a box that
// cannot be reached is reported, never destroyed, as the replica that made
// it may be serving it.
func (m *Manager) adopt(ctx context.Context, rec *store.Record) error {
	spec := &sbxv1.CreateSandboxRequest{}
	if err := protojson.Unmarshal(rec.Spec, spec); err != nil {
		return fmt.Errorf("decode spec of sandbox %s: %w", rec.ID, err)
	}
	drv, ok := m.cfg.Drivers[spec.Runtime]
	if !ok {
		return fmt.Errorf("sandbox %s uses runtime %q, which this replica does not have: %w", rec.ID, spec.Runtime, errdefs.ErrUnavailable)
	}
	var h runtime.Handle
	if len(rec.Handle) > 0 {
		if err := json.Unmarshal(rec.Handle, &h); err != nil {
			return fmt.Errorf("decode handle of sandbox %s: %w", rec.ID, err)
		}
	}
	if h.ID == "" {
		h = runtime.Handle{ID: rec.ID, Driver: spec.Runtime}
	}
	if stateOf(rec.State) == sbxv1.SandboxState_SANDBOX_STATE_RUNNING {
		nh, err := drv.Recover(ctx, h)
		if err != nil {
			return fmt.Errorf("reach sandbox %s made by another replica: %w", rec.ID, err)
		}
		h = nh
	}
	b := &box{id: rec.ID, driver: drv, rec: rec, handle: h,
		net:    network.Attachment{Policy: network.Policy{Mode: network.ModeNone}},
		tenant: rec.Tenant, parent: rec.Parent, tokenHash: rec.ScopedTokenHash}
	b.specp.Store(spec)
	b.lastActive.Store(max(rec.LastActiveAtMs, rec.CreatedAtMs))
	if st, err := drv.Stats(ctx, h); err == nil {
		b.oomSeen.Store(st.OOMKills)
	}
	b.conn = m.agentConn(drv, h)
	m.mu.Lock()
	if _, raced := m.boxes[rec.ID]; raced {
		m.mu.Unlock()
		b.conn.Close()
		return nil
	}
	// The store says rec holds its name: a box still holding it in memory
	// was destroyed through another replica.
	var stale *box
	if spec.Name != "" {
		if other, taken := m.names[nameKey(rec.Tenant, spec.Name)]; taken {
			stale = m.boxes[other]
		}
	}
	m.mu.Unlock()
	if stale != nil {
		m.dropStale(stale, "its name was taken through another replica")
	}
	if err := m.reserve(b, nil); err != nil {
		b.conn.Close()
		if errdefs.IsAlreadyExists(err) {
			return nil // adopted meanwhile by a concurrent lookup
		}
		return err
	}
	if stateOf(rec.State) == sbxv1.SandboxState_SANDBOX_STATE_RUNNING {
		m.watch(b, "agent died")
	}
	m.log.Debug("sandbox adopted from the shared state", "sandbox", rec.ID, "state", rec.State)
	return nil
}

// syncAll reads every record and brings memory in line: lists, quotas and
// timeouts then see every replica's sandboxes. It also finishes what dead
// replicas left (sweepRecord).
func (m *Manager) syncAll(ctx context.Context) error {
	recs, err := m.shared.List(ctx)
	if err != nil {
		return err
	}
	seen := make(map[string]bool, len(recs))
	var errs []error
	for _, rec := range recs {
		seen[rec.ID] = true
		if m.sweepRecord(ctx, rec) {
			continue
		}
		if err := m.syncRecord(ctx, rec); err != nil && !errdefs.IsFailedPrecondition(err) {
			errs = append(errs, err)
		}
	}
	if err := m.reconcileUsage(ctx, recs); err != nil {
		errs = append(errs, fmt.Errorf("reconciling usage ledgers: %w", err))
	}
	m.mu.RLock()
	var gone []*box
	for id, b := range m.boxes {
		if !seen[id] && b.persisted() && !b.creatingHere() {
			gone = append(gone, b)
		}
	}
	m.mu.RUnlock()
	for _, b := range gone {
		// A box created here after the List above has a record the List
		// missed: look once more before dropping it.
		if _, err := m.shared.Get(ctx, b.id); errdefs.IsNotFound(err) {
			m.dropStale(b, "destroyed through another replica")
		}
	}
	return errors.Join(errs...)
}

// sweepRecord finishes the work of a replica that died with rec half-way:
// a destroy whose teardown never ended, or a create that never ended. It
// reports whether it took rec over. Two replicas may sweep one record at
// once: a driver's Destroy and the store's Delete are idempotent.
func (m *Manager) sweepRecord(ctx context.Context, rec *store.Record) bool {
	now := time.Now()
	switch stateOf(rec.State) {
	case sbxv1.SandboxState_SANDBOX_STATE_DESTROYING:
		if m.tearingDown(rec.ID) || now.Sub(time.UnixMilli(rec.DestroyingSinceMs)) < m.cfg.TeardownGrace {
			return true
		}
	case sbxv1.SandboxState_SANDBOX_STATE_CREATING:
		m.mu.RLock()
		_, local := m.boxes[rec.ID]
		m.mu.RUnlock()
		if local || now.Sub(time.UnixMilli(rec.CreatedAtMs)) < m.cfg.CreatingGrace {
			return true
		}
	default:
		return false
	}
	spec := &sbxv1.CreateSandboxRequest{}
	_ = protojson.Unmarshal(rec.Spec, spec)
	var h runtime.Handle
	_ = json.Unmarshal(rec.Handle, &h)
	if h.ID == "" {
		h = runtime.Handle{ID: rec.ID, Driver: spec.Runtime}
	}
	log := m.log.With("sandbox", rec.ID, "state", rec.State)
	if drv, ok := m.cfg.Drivers[spec.Runtime]; ok {
		if err := drv.Destroy(ctx, h); err != nil {
			log.Error("finishing a teardown another replica left", "err", err)
			return true
		}
	}
	if err := m.cfg.Store.Delete(ctx, rec.ID); err != nil {
		log.Error("deleting a record another replica left", "err", err)
		return true
	}
	log.Info("finished a sandbox another replica left half-way")
	return true
}

// tearingDown reports whether this replica's teardown queue holds id.
func (m *Manager) tearingDown(id string) bool {
	t := &m.teardowns
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.dying[id]
	return ok
}

// refreshName makes sure a name this replica holds in memory is still held
// in the shared store, so a create of a name freed through another replica
// is not refused by a stale memory.
func (m *Manager) refreshName(ctx context.Context, tenantName, name string) {
	if m.shared == nil || name == "" {
		return
	}
	m.mu.RLock()
	_, taken := m.names[nameKey(tenantName, name)]
	m.mu.RUnlock()
	if !taken {
		return
	}
	rec, err := m.shared.ByName(ctx, tenantName, name)
	switch {
	case errdefs.IsNotFound(err):
		m.dropStaleRef(tenantName, name)
	case err == nil:
		_ = m.syncRecord(ctx, rec)
	}
}

// recoverShared is Recover with a shared store: every record is adopted,
// none destroyed (other replicas may be using them), and no driver or
// network cleanup runs, as another replica's box a record does not show
// yet may be half-made.
func (m *Manager) recoverShared(ctx context.Context) error {
	if err := m.syncAll(ctx); err != nil {
		m.log.Warn("adopting sandboxes from the shared state", "err", err)
	}
	return nil
}

// sweepShared runs syncAll every sharedSweepInterval until the manager
// stops.
func (m *Manager) sweepShared() {
	defer m.wg.Done()
	t := time.NewTicker(sharedSweepInterval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), sharedSweepInterval*4)
		if err := m.syncAll(ctx); err != nil {
			m.log.Warn("syncing with the shared state", "err", err)
		}
		cancel()
	}
}
