// Package sandbox owns the sandbox lifecycle: validation, ids and unique
// names, label selection, the state machine (creating → running ⇄ stopped →
// destroyed), lifetime and idle timeouts, persistence through internal/store
// and reconciliation after a daemon restart. It drives isolation only through
// runtime.Driver and reaches agents through internal/agentconn; it knows no
// driver and no RPC server. internal/daemon wires it; internal/server calls it.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/agentconn"
	"github.com/sbxdev/sbx/internal/crashpoint"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/events"
	"github.com/sbxdev/sbx/internal/network"
	"github.com/sbxdev/sbx/internal/phases"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/store"
	"github.com/sbxdev/sbx/internal/tenant"
)

// Config wires a Manager.
type Config struct {
	// Store keeps the records: the SQLite store, or a SharedStore
	// (shared.go) when several replicas serve the same sandboxes.
	Store Store
	// Drivers by name; DefaultRuntime names the one used when a request says none.
	Drivers        map[string]runtime.Driver
	DefaultRuntime string
	// Defaults fill resources a request leaves zero.
	Defaults runtime.Resources
	// DefaultTimeout is the lifetime of a sandbox whose request gives none (0: unlimited).
	DefaultTimeout time.Duration
	Limits         Limits
	Logger         *slog.Logger
	// TickInterval is how often timeouts are checked (default 250ms).
	TickInterval time.Duration
	// AgentProtocol is the highest daemon↔agent protocol the manager uses
	// with its boxes' agents (0: all internal/agentconn speaks). Tests set
	// it to drive the paths kept for older agents.
	AgentProtocol uint32
	// Images resolves image references (nil: only the host image).
	Images Images
	// WarmPool is how many started boxes (default runtime, host image,
	// default limits) are kept ready for creates to take over at least
	// (0: no pool); WarmPoolMax is how many the pool may grow to under
	// demand (0: DefaultWarmPoolMax, or WarmPool if larger). See pool.go.
	WarmPool, WarmPoolMax int
	// Network attaches sandboxes to the network (nil: loopback only).
	Network Network
	// Volumes resolves named volumes (nil: requests with volumes fail).
	Volumes Volumes
	// Codebases mounts codebases (nil: requests with codebases fail).
	Codebases Codebases
	// BoxAPIAddr is host:port of the daemon's API as boxes reach it (on the
	// network gateway), given to sandboxes with a scoped token as SBX_ADDR
	// ("": no box can hold a scoped token).
	BoxAPIAddr string
	// MaxLayerBytes caps the apparent size (holes included) of the layer
	// Diff and Snapshot copy out of a sandbox, whatever its disk limit
	// (0: unbounded; the daemon sets `sbx serve --max-layer-size`).
	MaxLayerBytes int64
	// Events receives the sandboxes' lifecycle events (nil: none; see
	// observe.go).
	Events *events.Bus
	// CreatingGrace and TeardownGrace are how long a record of a shared
	// store may stay creating, or destroying, before another replica
	// finishes it as a dead replica's leftover (0: DefaultCreatingGrace,
	// DefaultTeardownGrace; see shared.go).
	CreatingGrace, TeardownGrace time.Duration
}

// Manager runs sandboxes. All methods are safe for concurrent use; lifecycle
// operations on one sandbox are serialised, on different sandboxes they run
// in parallel.
type Manager struct {
	cfg Config
	log *slog.Logger
	// shared is cfg.Store when several replicas share it (nil otherwise).
	shared SharedStore
	// ledger is shared when it keeps usage ledgers: quotas are then
	// admitted through it, not against memory.
	ledger UsageLedger

	mu sync.RWMutex
	// boxes holds every sandbox not yet destroyed, by id. Guarded by mu.
	boxes map[string]*box
	// names maps nameKey(tenant, name) to ids of boxes in boxes. Guarded by mu.
	names map[string]string
	// scoped maps the hashes of sandboxes' scoped tokens to their ids.
	// Guarded by mu.
	scoped map[string]string
	// tombstones remembers why recently removed sandboxes are gone. Guarded by mu.
	tombstones map[string]tombstone

	// pool holds warm boxes (nil when disabled).
	pool *warmPool
	// teardowns tears destroyed boxes down in the background.
	teardowns teardowns

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

type tombstone struct {
	reason         string
	at             time.Time
	tenant, parent string
}

type box struct {
	id     string
	driver runtime.Driver
	// tenant owns the box; parent is the box whose scoped token made it;
	// tokenHash is the hash of its own scoped token. All immutable.
	tenant, parent, tokenHash string
	// token is the scoped token itself, kept only while the box is created.
	token string
	// specp holds the validated request with defaults applied (see spec).
	specp atomic.Pointer[sbxv1.CreateSandboxRequest]

	lastActive atomic.Int64 // unix ms
	dirty      atomic.Bool  // lastActive not yet persisted
	busy       atomic.Int64 // operations in flight (keeps the box from idling)
	// oomSeen is the box's count of OOM kills when last looked at (see
	// OOMKilled): 0 for a new box, read at recovery for an old one.
	oomSeen atomic.Int64

	// entryMu guards entryBase and entryMark (MarkEntrypoint).
	entryMu sync.Mutex
	// entryBase is the box's limit counters as its own command started:
	// zero for a new box, read at recovery for an old one.
	entryBase runtime.LimitEvents
	// entryMark is what the exit of the box's command was told, once seen.
	entryMark *entryMark

	// opMu serialises lifecycle operations (create, stop, start, destroy).
	opMu sync.Mutex

	mu sync.Mutex
	// The fields below are guarded by mu.
	rec    *store.Record
	handle runtime.Handle
	conn   *agentconn.Conn
	net    network.Attachment
}

// notRunning is the error for an operation that needs b running while it
// is in state st: a failed box's error says why it failed (its agent died).
func (b *box) notRunning(st sbxv1.SandboxState) error {
	if st == sbxv1.SandboxState_SANDBOX_STATE_FAILED {
		b.mu.Lock()
		detail := b.rec.StateDetail
		b.mu.Unlock()
		if detail != "" {
			return fmt.Errorf("sandbox %s is failed (%s): %w", b.id, detail, errdefs.ErrFailedPrecondition)
		}
	}
	return fmt.Errorf("sandbox %s is %s: %w", b.id, stateName(st), errdefs.ErrFailedPrecondition)
}

// spec returns the box's validated request with defaults applied. What it
// points to is never changed: UpdateSandbox stores a changed copy (under
// b.opMu and, for limits, m.mu), so a reader sees one whole version.
func (b *box) spec() *sbxv1.CreateSandboxRequest { return b.specp.Load() }

func (b *box) state() sbxv1.SandboxState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return stateOf(b.rec.State)
}

// New returns a Manager. Call Recover before serving, then Run.
func New(cfg Config) (*Manager, error) {
	if cfg.Store == nil {
		return nil, errors.New("sandbox manager needs a store")
	}
	if _, ok := cfg.Drivers[cfg.DefaultRuntime]; !ok {
		return nil, fmt.Errorf("default runtime %q is not configured", cfg.DefaultRuntime)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.TickInterval == 0 {
		cfg.TickInterval = 250 * time.Millisecond
	}
	if cfg.CreatingGrace == 0 {
		cfg.CreatingGrace = DefaultCreatingGrace
	}
	if cfg.TeardownGrace == 0 {
		cfg.TeardownGrace = DefaultTeardownGrace
	}
	// The default disk (that of warm boxes too) fits the default memory
	// when the default runtime keeps disks in memory.
	if info := cfg.Drivers[cfg.DefaultRuntime].Info(context.Background()); info.Has(runtime.CapDiskInMemory) && cfg.Defaults.MemoryBytes > 0 {
		cfg.Defaults.DiskBytes = min(cfg.Defaults.DiskBytes, MaxDiskInMemory(cfg.Defaults.MemoryBytes))
	}
	m := &Manager{
		cfg:        cfg,
		log:        cfg.Logger,
		boxes:      map[string]*box{},
		names:      map[string]string{},
		scoped:     map[string]string{},
		tombstones: map[string]tombstone{},
		stop:       make(chan struct{}),
	}
	if s, ok := cfg.Store.(SharedStore); ok {
		m.shared = s
		m.ledger, _ = s.(UsageLedger)
	}
	if cfg.WarmPool > 0 && !cfg.Drivers[cfg.DefaultRuntime].Info(context.Background()).Has(runtime.CapHostImage) {
		// The pool keeps host-image boxes: a default runtime without the
		// host image (kubernetes) would fail every refill.
		cfg.Logger.Warn("no warm pool: the default runtime cannot run the host image", "runtime", cfg.DefaultRuntime)
		cfg.WarmPool = 0
	}
	if cfg.WarmPool > 0 {
		if cfg.WarmPoolMax == 0 {
			cfg.WarmPoolMax = max(cfg.WarmPool, DefaultWarmPoolMax)
		}
		if cfg.WarmPoolMax < cfg.WarmPool {
			return nil, fmt.Errorf("warm pool ceiling %d is below its floor %d: %w", cfg.WarmPoolMax, cfg.WarmPool, errdefs.ErrInvalidArgument)
		}
		m.pool = newWarmPool(cfg.WarmPool, cfg.WarmPoolMax)
	}
	return m, nil
}

// Runtimes describes the configured drivers.
func (m *Manager) Runtimes(ctx context.Context) []*sbxv1.RuntimeInfo {
	var out []*sbxv1.RuntimeInfo
	for _, name := range slices.Sorted(maps.Keys(m.cfg.Drivers)) {
		info := m.cfg.Drivers[name].Info(ctx)
		out = append(out, &sbxv1.RuntimeInfo{
			Name: name, Healthy: info.Healthy, HealthDetail: info.Detail,
			Capabilities: runtime.CapabilityNames(info.Capabilities), IsDefault: name == m.cfg.DefaultRuntime,
		})
	}
	return out
}

func nowMs() int64 { return time.Now().UnixMilli() }

func protojsonMarshal(spec *sbxv1.CreateSandboxRequest) ([]byte, error) {
	b, err := protojson.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("encode spec: %w", err)
	}
	return b, nil
}

// isUserError reports errors a retry with a cold create would only repeat.
func isUserError(err error) bool {
	if errdefs.IsAlreadyExists(err) || errdefs.IsInvalidArgument(err) {
		return true
	}
	// The agent's refusals of the sandbox's own settings (a command that
	// cannot start, an unknown user): a cold box would refuse them too.
	var ce *connect.Error
	return errors.As(err, &ce) && (ce.Code() == connect.CodeFailedPrecondition || ce.Code() == connect.CodeInvalidArgument)
}

// Create validates req, starts a sandbox and returns it once its agent answers.
func (m *Manager) Create(ctx context.Context, req *sbxv1.CreateSandboxRequest) (*sbxv1.Sandbox, error) {
	pt := phases.Start()
	if err := validateCreate(req, m.cfg.Limits); err != nil {
		return nil, err
	}
	if err := m.checkOwner(ctx, req); err != nil {
		return nil, err
	}
	guards, err := validatePathPolicies(req)
	if err != nil {
		return nil, err
	}
	spec := proto.Clone(req).(*sbxv1.CreateSandboxRequest)
	// Every guard, codebases' included, is a path policy of the sandbox.
	spec.PathPolicies = guards
	img, releaseImage, err := m.resolveImage(ctx, spec)
	if err != nil {
		return nil, err
	}
	// Held until the box is registered (and so counts in ImagesInUse).
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(releaseImage) }
	defer release()
	if spec.Runtime == "" {
		spec.Runtime = m.cfg.DefaultRuntime
	}
	drv, ok := m.cfg.Drivers[spec.Runtime]
	if !ok {
		return nil, invalid("runtime %q: not configured (have %v)", spec.Runtime, slices.Sorted(maps.Keys(m.cfg.Drivers)))
	}
	info := drv.Info(ctx)
	if !info.Healthy {
		return nil, fmt.Errorf("runtime %q is unhealthy: %s: %w", spec.Runtime, info.Detail, errdefs.ErrUnavailable)
	}
	if err := m.applyDefaults(spec, info); err != nil {
		return nil, err
	}
	defaultNetworkFor(info, spec)
	pol, err := m.requestedPolicy(spec, info)
	if err != nil {
		return nil, err
	}
	if err := m.requireCapabilities(info, spec, img, pol); err != nil {
		return nil, err
	}
	mounts, err := m.resolveVolumes(ctx, spec)
	if err != nil {
		return nil, err
	}
	if err := validateCodebases(spec); err != nil {
		return nil, err
	}

	pt.Mark("validate")
	w, done := m.takeWarm(ctx, spec, drv, pol)
	defer done()
	if w != nil {
		pt.Mark("take")
		sb, err := m.claimWarm(ctx, w, spec, drv, pol)
		if err == nil {
			pt.Mark("claim")
			m.emitCreated(sb.GetId(), "warm")
			m.log.Debug("create phases", "sandbox", sb.GetId(), "warm", true, "phases", pt)
		}
		if err == nil || isUserError(err) {
			return sb, err
		}
		m.log.Warn("warm pool: handing over a box failed; creating one", "err", err)
	}

	b, rec, err := m.newBox(ctx, newID(), spec, drv)
	if err != nil {
		return nil, err
	}
	rec.ImageDigest = img.Digest

	// Reserve id and name in memory first so a concurrent create of the same
	// name fails fast, then persist before touching the host: a crash from
	// here on leaves a record that Recover cleans up.
	b.opMu.Lock()
	defer b.opMu.Unlock()
	m.refreshName(ctx, b.tenant, spec.Name)
	if err := m.reserve(b, new(tenant.FromContext(ctx))); err != nil {
		return nil, err
	}
	if err := m.admitShared(ctx, b, new(tenant.FromContext(ctx))); err != nil {
		m.forget(b.id, "")
		return nil, err
	}
	release()
	if err := m.cfg.Store.Insert(ctx, rec); err != nil {
		m.forget(b.id, "")
		m.unreserveShared(ctx, b)
		return nil, err
	}
	crashpoint.Hit("create-recorded")
	pt.Mark("record")
	fail := func(err error) (*sbxv1.Sandbox, error) {
		// Clean up with a fresh context: the caller's may be what failed.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if derr := drv.Destroy(cctx, b.handle); derr != nil {
			m.log.Error("rolling back failed create", "sandbox", b.id, "err", derr)
		}
		m.detachNetwork(cctx, b.id)
		m.unmountCodebases(cctx, b.id)
		if derr := m.cfg.Store.Delete(cctx, b.id); derr != nil {
			m.log.Error("deleting record of failed create", "sandbox", b.id, "err", derr)
		}
		m.forget(b.id, "creation failed: "+err.Error())
		m.emit(b, sbxv1.EventType_EVENT_TYPE_FAILED, "create", err.Error())
		return nil, err
	}

	rs := runtimeSpec(b.id, spec, img)
	rs.Env = append(rs.Env, m.scopedEnv(b)...)
	rs.Meta = runtime.Meta{Name: spec.Name, Tenant: b.tenant, Labels: spec.Labels}
	b.mu.Lock()
	if ms := b.rec.ExpiresAtMs; ms > 0 {
		rs.Meta.Expires = time.UnixMilli(ms)
	}
	b.mu.Unlock()
	cbMounts, err := m.mountCodebases(ctx, b.id, spec)
	if err != nil {
		return fail(err)
	}
	rs.Mounts = append(mounts, cbMounts...)
	pol = m.withSecrets(b.id, spec, pol)
	if err := m.addDomainSecrets(&rs, spec, pol.Secrets); err != nil {
		return fail(err)
	}
	b.mu.Lock()
	b.net = network.Attachment{Policy: pol}
	b.mu.Unlock()
	if m.cfg.Network != nil && info.Has(runtime.CapNetwork) {
		att, err := m.cfg.Network.Attach(ctx, b.id, pol)
		if err != nil {
			return fail(fmt.Errorf("attach sandbox network: %w", err))
		}
		b.mu.Lock()
		b.net = att
		b.mu.Unlock()
		rs.Network = netAttachment(att)
	} else if info.Has(runtime.CapPodNetwork) {
		rs.Network = podNetwork(pol)
	}
	pt.Mark("network")
	crashpoint.Hit("create-prepared")
	h, err := drv.Create(ctx, rs)
	if err != nil {
		return fail(fmt.Errorf("create sandbox: %w", err))
	}
	pt.Mark("driver")
	// Create returned with the agent serving (the driver contract).
	conn := m.agentConn(drv, h)
	b.mu.Lock()
	b.handle = h
	b.conn = conn
	b.mu.Unlock()
	crashpoint.Hit("create-started")
	if configuredByAgent(spec) {
		// The agent starts the command now: as the user, after the path
		// guards are mounted, and so that one that cannot start fails the
		// create (see configuredByAgent).
		if err := configure(ctx, conn, rs.Env, spec); err != nil {
			return fail(err)
		}
	} else {
		go warmUp(conn)
	}
	if err := m.setState(ctx, b, sbxv1.SandboxState_SANDBOX_STATE_RUNNING, ""); err != nil {
		return fail(err)
	}
	crashpoint.Hit("create-running")
	pt.Mark("running")
	m.watch(b, "agent died")
	m.log.Info("sandbox created", "sandbox", b.id, "name", spec.Name, "runtime", spec.Runtime)
	m.log.Debug("create phases", "sandbox", b.id, "warm", false, "phases", pt)
	m.emit(b, sbxv1.EventType_EVENT_TYPE_CREATED, "cold", "")
	m.emit(b, sbxv1.EventType_EVENT_TYPE_STARTED, "", "")
	return m.toProto(b, nil), nil
}

// agentConn returns a client of box h's agent, with framed execs where the
// driver offers them, speaking at most Config.AgentProtocol.
func (m *Manager) agentConn(drv runtime.Driver, h runtime.Handle) *agentconn.Conn {
	dial := func(ctx context.Context) (netConn, error) { return drv.Dial(ctx, h) }
	opts := []agentconn.Option{agentconn.WithMaxProtocol(m.cfg.AgentProtocol)}
	if ed, ok := drv.(runtime.ExecDialer); ok {
		opts = append(opts, agentconn.WithExecDial(func(ctx context.Context) (netConn, error) { return ed.DialExec(ctx, h) }))
	}
	return agentconn.New(dial, opts...)
}

// warmUp opens the daemon's connection to a new box's agent while the
// create's answer travels, so the first exec does not pay for it.
func warmUp(conn *agentconn.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), runtime.ProbeTimeout)
	defer cancel()
	_, _ = conn.Hello(ctx)
}

// MaxDiskInMemory is the largest disk a box whose disk is held in its
// memory may have: its memory less an eighth of it, and at least 32 MiB, for
// the agent and the box's processes (1 MiB for the smallest boxes).
func MaxDiskInMemory(memory int64) int64 {
	return max(memory-max(memory/8, 32<<20), 1<<20)
}

// applyDefaults fills what a create leaves zero, and keeps the disk of a
// driver whose disk lives in the box's memory below that memory (see
// MaxDiskInMemory): a default disk shrinks to fit, an explicit one that does
// not fit is refused.
func (m *Manager) applyDefaults(spec *sbxv1.CreateSandboxRequest, info runtime.Info) error {
	if spec.Resources == nil {
		spec.Resources = &sbxv1.Resources{}
	}
	r, d := spec.Resources, m.cfg.Defaults
	if r.MemoryBytes == 0 {
		r.MemoryBytes = d.MemoryBytes
	}
	if info.Has(runtime.CapDiskInMemory) {
		limit := MaxDiskInMemory(r.MemoryBytes)
		switch {
		case r.DiskBytes == 0:
			r.DiskBytes = min(d.DiskBytes, limit)
		case r.DiskBytes > limit:
			return invalid("disk %s: runtime %q keeps a sandbox's disk in its memory, so it must leave room for processes: at most %s with memory %s (raise the memory or lower the disk)",
				FormatBytes(r.DiskBytes), info.Name, FormatBytes(limit), FormatBytes(r.MemoryBytes))
		}
	}
	if r.CpuMillis == 0 {
		r.CpuMillis = d.CPUMillis
	}
	if r.Pids == 0 {
		r.Pids = d.Pids
	}
	if r.DiskBytes == 0 {
		r.DiskBytes = d.DiskBytes
	}
	if spec.TimeoutMs == 0 {
		spec.TimeoutMs = m.cfg.DefaultTimeout.Milliseconds()
	}
	if spec.IdleAction == sbxv1.IdleAction_IDLE_ACTION_UNSPECIFIED {
		spec.IdleAction = sbxv1.IdleAction_IDLE_ACTION_DESTROY
	}
	if spec.Workdir == "" {
		// Like docker for images ("/"); root's home for the host image, whose
		// root filesystem is otherwise just mount points.
		spec.Workdir = "/"
		if spec.Image == HostImage && spec.User == "" {
			spec.Workdir = "/root"
		}
	}
	return nil
}

// runtimeSpec is what the driver gets for a sandbox. The command is left
// out when configure starts it (configuredByAgent).
func runtimeSpec(id string, spec *sbxv1.CreateSandboxRequest, img *ResolvedImage) runtime.Spec {
	env := make([]string, 0, len(spec.Env)+len(spec.Secrets)+1)
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		env = append(env, k+"="+spec.Env[k])
	}
	for _, k := range slices.Sorted(maps.Keys(spec.Secrets)) {
		env = append(env, k+"="+spec.Secrets[k])
	}
	env = append(env, "SBX_SANDBOX_ID="+id)
	r := spec.GetResources()
	image := runtime.Image{Ref: spec.Image}
	if img != nil {
		image.Digest, image.Layers = img.Digest, img.Layers
	}
	if img == nil || img.OnHost {
		image.Host = &runtime.HostImage{}
	}
	command := spec.Command
	if configuredByAgent(spec) {
		command = nil
	}
	return runtime.Spec{
		ID:       id,
		Image:    image,
		Env:      env,
		Workdir:  spec.Workdir,
		Command:  command,
		Hostname: id,
		Resources: runtime.Resources{
			MemoryBytes: r.GetMemoryBytes(), CPUMillis: r.GetCpuMillis(),
			Pids: r.GetPids(), DiskBytes: r.GetDiskBytes(),
		},
	}
}

// reserve registers b, checking its name (per tenant) and, for a create
// (admit is its Principal), the tenant's quotas; recovery passes nil and
// re-registers what was admitted before.
func (m *Manager) reserve(b *box, admit *tenant.Principal) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := nameKey(b.tenant, b.spec().Name)
	if b.spec().Name != "" {
		if other, taken := m.names[key]; taken {
			return fmt.Errorf("name %q is already used by sandbox %s: %w", b.spec().Name, other, errdefs.ErrAlreadyExists)
		}
	}
	if admit != nil {
		if b.parent != "" {
			// The parent may be dying while its child is made: once it is
			// destroying, its children have been collected for destruction,
			// so a child registered now would outlive it.
			p, ok := m.boxes[b.parent]
			if ok {
				st := p.state()
				ok = p.tenant == b.tenant && (st == sbxv1.SandboxState_SANDBOX_STATE_RUNNING || st == sbxv1.SandboxState_SANDBOX_STATE_STOPPED)
			}
			if !ok {
				return fmt.Errorf("parent sandbox %s is gone: %w", b.parent, errdefs.ErrFailedPrecondition)
			}
		}
		// With a usage ledger, admitShared checks the quotas instead.
		if m.ledger == nil {
			if err := admit.Quotas.Admit(b.tenant, m.usageLocked(b.tenant), usageOf(b)); err != nil {
				return err
			}
		}
	}
	if b.spec().Name != "" {
		m.names[key] = b.id
	}
	if b.tokenHash != "" {
		m.scoped[b.tokenHash] = b.id
	}
	m.boxes[b.id] = b
	return nil
}

// forget drops a box from memory; reason, if set, is kept as a tombstone.
func (m *Manager) forget(id, reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.boxes[id]
	if ok {
		if key := nameKey(b.tenant, b.spec().Name); b.spec().Name != "" && m.names[key] == id {
			delete(m.names, key)
		}
		if b.tokenHash != "" && m.scoped[b.tokenHash] == id {
			delete(m.scoped, b.tokenHash)
		}
		delete(m.boxes, id)
	}
	if reason != "" {
		if len(m.tombstones) > 10000 {
			clear(m.tombstones)
		}
		t := tombstone{reason: reason, at: time.Now()}
		if ok {
			t.tenant, t.parent = b.tenant, b.parent
		}
		m.tombstones[id] = t
	}
}

// lookup resolves an id or a name as ctx's Principal sees them: its
// tenant's names, and only boxes it may touch. A box it may not touch is
// answered exactly like one that never existed.
func (m *Manager) lookup(ctx context.Context, ref string) (*box, error) {
	if ref == "" {
		return nil, invalid("no sandbox id or name given")
	}
	if m.shared != nil {
		return m.lookupShared(ctx, ref)
	}
	return m.lookupLocal(ctx, ref)
}

// lookupLocal is lookup in memory only.
func (m *Manager) lookupLocal(ctx context.Context, ref string) (*box, error) {
	p := tenant.FromContext(ctx)
	m.mu.RLock()
	defer m.mu.RUnlock()
	if b, ok := m.boxes[ref]; ok && visible(p, b.id, b.tenant, b.parent) {
		return b, nil
	}
	if id, ok := m.names[nameKey(p.Tenant, ref)]; ok {
		if b := m.boxes[id]; visible(p, b.id, b.tenant, b.parent) {
			return b, nil
		}
	}
	if t, ok := m.tombstones[ref]; ok && visible(p, ref, t.tenant, t.parent) {
		return nil, fmt.Errorf("sandbox %s is gone (%s at %s): %w", ref, t.reason, t.at.Format(time.RFC3339), errdefs.ErrNotFound)
	}
	return nil, fmt.Errorf("sandbox %q: %w", ref, errdefs.ErrNotFound)
}

// setState persists a state change.
func (m *Manager) setState(ctx context.Context, b *box, st sbxv1.SandboxState, detail string) error {
	b.mu.Lock()
	rec := *b.rec
	rec.State = stateName(st)
	rec.StateDetail = detail
	hjson, err := marshalHandle(b.handle)
	if err != nil {
		b.mu.Unlock()
		return err
	}
	rec.Handle = hjson
	rec.LastActiveAtMs = b.lastActive.Load()
	b.mu.Unlock()
	if err := m.cfg.Store.Update(ctx, &rec); err != nil {
		return err
	}
	b.mu.Lock()
	b.rec = &rec
	b.mu.Unlock()
	return nil
}

// Get returns a sandbox with live stats.
func (m *Manager) Get(ctx context.Context, ref string) (*sbxv1.Sandbox, error) {
	return m.Describe(ctx, ref, true)
}

// Describe returns a sandbox by id or name, with its live stats if stats
// is set. Without them it is a map lookup: no driver call (cgroup reads,
// disk use; a runsc fork under gvisor) and no network counters (a read of
// the host's whole connection table), which is what a caller resolving a
// name before an exec wants.
func (m *Manager) Describe(ctx context.Context, ref string, stats bool) (*sbxv1.Sandbox, error) {
	b, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	if !stats {
		return m.toProto(b, nil), nil
	}
	return m.toProto(b, m.liveStats(ctx, b)), nil
}

// liveStats measures a running or stopped box (nil otherwise, or when the
// driver cannot tell).
func (m *Manager) liveStats(ctx context.Context, b *box) *sbxv1.SandboxStats {
	var stats *sbxv1.SandboxStats
	if st := b.state(); st == sbxv1.SandboxState_SANDBOX_STATE_RUNNING || st == sbxv1.SandboxState_SANDBOX_STATE_STOPPED {
		b.mu.Lock()
		h := b.handle
		b.mu.Unlock()
		if s, err := b.driver.Stats(ctx, h); err == nil {
			stats = &sbxv1.SandboxStats{
				MemoryBytes: s.MemoryBytes, MemoryPeakBytes: s.MemoryPeakBytes, CpuUsageNs: s.CPUUsageNs,
				Pids: s.Pids, DiskUsedBytes: s.DiskUsedBytes,
			}
			if m.cfg.Network != nil {
				if ns, err := m.cfg.Network.Stats(b.id); err == nil {
					stats.NetRxBytes, stats.NetTxBytes = ns.RxBytes, ns.TxBytes
					stats.NetRxPackets, stats.NetTxPackets = ns.RxPackets, ns.TxPackets
					stats.NetConnections = ns.Connections
				}
			}
		}
	}
	return stats
}

// IDs returns the ids of every sandbox, of every tenant (for the daemon's
// own housekeeping; never for an API caller).
func (m *Manager) IDs() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return slices.Sorted(maps.Keys(m.boxes))
}

// List returns the sandboxes whose labels match every selector, oldest first.
func (m *Manager) List(ctx context.Context, selectors []string) ([]*sbxv1.Sandbox, error) {
	sel, err := ParseSelectors(selectors)
	if err != nil {
		return nil, err
	}
	if m.shared != nil {
		if err := m.syncAll(ctx); err != nil {
			return nil, fmt.Errorf("list sandboxes: %w", err)
		}
	}
	m.mu.RLock()
	boxes := slices.Collect(maps.Values(m.boxes))
	m.mu.RUnlock()
	var out []*sbxv1.Sandbox
	p := tenant.FromContext(ctx)
	for _, b := range boxes {
		if visible(p, b.id, b.tenant, b.parent) && Matches(sel, b.spec().Labels) {
			out = append(out, m.toProto(b, nil))
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].CreatedAtMs != out[j].CreatedAtMs {
			return out[i].CreatedAtMs < out[j].CreatedAtMs
		}
		return out[i].Id < out[j].Id
	})
	return out, nil
}

// Stop freezes every process of a running sandbox.
func (m *Manager) Stop(ctx context.Context, ref string) (*sbxv1.Sandbox, error) {
	b, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	if err := m.stopBox(ctx, b, ""); err != nil {
		return nil, err
	}
	return m.toProto(b, nil), nil
}

func (m *Manager) stopBox(ctx context.Context, b *box, detail string) error {
	b.opMu.Lock()
	defer b.opMu.Unlock()
	return m.stopLocked(ctx, b, detail)
}

// stopLocked freezes b; b.opMu must be held.
func (m *Manager) stopLocked(ctx context.Context, b *box, detail string) error {
	switch st := b.state(); st {
	case sbxv1.SandboxState_SANDBOX_STATE_STOPPED:
		return nil
	case sbxv1.SandboxState_SANDBOX_STATE_RUNNING:
	default:
		return b.notRunning(st)
	}
	if err := b.require(ctx, runtime.CapPause, "stopping a sandbox"); err != nil {
		return err
	}
	b.mu.Lock()
	h := b.handle
	b.mu.Unlock()
	if err := b.driver.Pause(ctx, h); err != nil {
		return fmt.Errorf("stop sandbox %s: %w", b.id, err)
	}
	if err := m.setState(ctx, b, sbxv1.SandboxState_SANDBOX_STATE_STOPPED, detail); err != nil {
		return err
	}
	m.emit(b, sbxv1.EventType_EVENT_TYPE_STOPPED, stopReason(detail), detail)
	return nil
}

// Start resumes a stopped sandbox.
func (m *Manager) Start(ctx context.Context, ref string) (*sbxv1.Sandbox, error) {
	b, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	if _, err := m.resume(ctx, b, "start"); err != nil {
		return nil, err
	}
	return m.toProto(b, nil), nil
}

// running returns nil if b is running, after starting it if it is stopped
// and has auto_resume, else an error saying why b cannot be used.
func (m *Manager) running(ctx context.Context, b *box) error {
	st := b.state()
	if st == sbxv1.SandboxState_SANDBOX_STATE_STOPPED && b.spec().AutoResume {
		var err error
		if st, err = m.resume(ctx, b, "auto-resume"); err != nil {
			return err
		}
	}
	switch st {
	case sbxv1.SandboxState_SANDBOX_STATE_RUNNING:
		return nil
	case sbxv1.SandboxState_SANDBOX_STATE_STOPPED:
		return fmt.Errorf("sandbox %s is stopped; start it first (or give it auto_resume): %w", b.id, errdefs.ErrFailedPrecondition)
	default:
		return b.notRunning(st)
	}
}

// resume starts b if it is stopped (why says who asked, for the log) and
// returns its state afterwards: running, or an error for a box that is
// neither running nor stopped.
func (m *Manager) resume(ctx context.Context, b *box, why string) (sbxv1.SandboxState, error) {
	b.opMu.Lock()
	defer b.opMu.Unlock()
	switch st := b.state(); st {
	case sbxv1.SandboxState_SANDBOX_STATE_RUNNING:
		return st, nil
	case sbxv1.SandboxState_SANDBOX_STATE_STOPPED:
	default:
		return st, b.notRunning(st)
	}
	b.mu.Lock()
	h := b.handle
	b.mu.Unlock()
	if err := b.driver.Resume(ctx, h); err != nil {
		return sbxv1.SandboxState_SANDBOX_STATE_STOPPED, fmt.Errorf("start sandbox %s: %w", b.id, err)
	}
	b.lastActive.Store(nowMs())
	if err := m.setState(ctx, b, sbxv1.SandboxState_SANDBOX_STATE_RUNNING, ""); err != nil {
		return sbxv1.SandboxState_SANDBOX_STATE_STOPPED, err
	}
	m.log.Info("sandbox started", "sandbox", b.id, "by", why)
	reason := "user"
	if why != "start" {
		reason = "auto_resume"
	}
	m.emit(b, sbxv1.EventType_EVENT_TYPE_STARTED, reason, "")
	return sbxv1.SandboxState_SANDBOX_STATE_RUNNING, nil
}

// Destroy destroys a sandbox: once it returns, the sandbox is gone from
// every listing and its name is free; its box is killed and everything it
// held released in the background (teardown.go), finished by the next
// start's recovery if the daemon dies first.
func (m *Manager) Destroy(ctx context.Context, ref string) error {
	b, err := m.lookup(ctx, ref)
	if err != nil {
		return err
	}
	return m.destroyBox(ctx, b, "destroyed")
}

func (m *Manager) destroyBox(ctx context.Context, b *box, reason string) error {
	b.opMu.Lock()
	defer b.opMu.Unlock()
	return m.destroyLocked(ctx, b, reason)
}

// destroyLocked destroys b; b.opMu must be held. It returns once b is
// marked destroying in the store (its name free for a new sandbox) and
// gone from memory; the teardown runs in the background (teardown.go).
func (m *Manager) destroyLocked(ctx context.Context, b *box, reason string) error {
	// Finish the destroy even if the caller goes away half-way.
	ctx = context.WithoutCancel(ctx)
	if st := b.state(); st == sbxv1.SandboxState_SANDBOX_STATE_DESTROYING || st == sbxv1.SandboxState_SANDBOX_STATE_DESTROYED {
		return nil
	}
	failed := b.state() == sbxv1.SandboxState_SANDBOX_STATE_FAILED
	if err := m.markDestroying(ctx, b, reason); err != nil {
		return err
	}
	crashpoint.Hit("destroy-marked")
	m.emitDestroyed(b, reason, failed)
	// Children die with their parent (first: their tokens are its code's).
	m.destroyChildren(ctx, b.id)
	b.mu.Lock()
	conn := b.conn
	b.conn = nil
	b.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
	m.forget(b.id, reason)
	if !m.tearDownLater(b, reason, m.kill(ctx, b)) {
		m.tearDown(ctx, b, reason)
	}
	return nil
}

// markDestroying persists that b is being destroyed, releasing its name.
func (m *Manager) markDestroying(ctx context.Context, b *box, reason string) error {
	b.mu.Lock()
	rec := *b.rec
	rec.State = stateName(sbxv1.SandboxState_SANDBOX_STATE_DESTROYING)
	rec.StateDetail = reason
	hjson, err := marshalHandle(b.handle)
	b.mu.Unlock()
	if err != nil {
		return err
	}
	rec.Handle = hjson
	if err := m.cfg.Store.MarkDestroying(ctx, &rec); err != nil {
		if m.shared != nil && errdefs.IsNotFound(err) {
			// Another replica destroyed it first.
			m.dropStale(b, "destroyed through another replica")
		}
		return err
	}
	b.mu.Lock()
	b.rec = &rec
	b.mu.Unlock()
	return nil
}

// Agent returns a client of a running sandbox's agent for one operation.
// The caller must call release when the operation ends; while it runs the
// sandbox counts as active and does not idle out. A stopped sandbox made
// with auto_resume is started first; other stopped ones are refused.
func (m *Manager) Agent(ctx context.Context, ref string) (conn *agentconn.Conn, release func(), err error) {
	b, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	// Busy first: an idle stop that has not begun yet then leaves b be.
	b.busy.Add(1)
	if err := m.running(ctx, b); err != nil {
		b.busy.Add(-1)
		return nil, nil, err
	}
	b.mu.Lock()
	st, conn := stateOf(b.rec.State), b.conn
	b.mu.Unlock()
	if st != sbxv1.SandboxState_SANDBOX_STATE_RUNNING || conn == nil {
		b.busy.Add(-1)
		return nil, nil, b.notRunning(st)
	}
	m.touch(b)
	return conn, func() { m.touch(b); b.busy.Add(-1) }, nil
}

// OOMKilled is oomKilled for sandbox ref: the background processes'
// exits use it (the daemon does not see them start, so it has no count from
// their start to compare with).
func (m *Manager) OOMKilled(ctx context.Context, ref string) bool {
	b, err := m.lookup(ctx, ref)
	if err != nil {
		return false
	}
	return m.oomKilled(ctx, b)
}

// oomKilled reports whether a command of a driver without LimitEvents
// that just ended by SIGKILL (its own death, or a shell's exit code 137
// for a child's) was killed by the sandbox's memory limit: the sandbox's
// count of OOM kills rose since it was last looked at. Commands of other
// drivers count over their own life (LimitWatch, MarkEntrypoint).
func (m *Manager) oomKilled(ctx context.Context, b *box) bool {
	b.mu.Lock()
	h := b.handle
	b.mu.Unlock()
	st, err := b.driver.Stats(ctx, h)
	if err != nil {
		return false
	}
	return b.oomSeen.Swap(st.OOMKills) < st.OOMKills
}

func (m *Manager) touch(b *box) {
	b.lastActive.Store(nowMs())
	b.dirty.Store(true)
}

func (m *Manager) toProto(b *box, stats *sbxv1.SandboxStats) *sbxv1.Sandbox {
	b.mu.Lock()
	rec, att := *b.rec, b.net
	b.mu.Unlock()
	s := b.spec()
	out := &sbxv1.Sandbox{
		Id: b.id, Name: s.Name, Labels: s.Labels, Image: s.Image, Runtime: s.Runtime,
		State: stateOf(rec.State), Env: s.Env, Command: s.Command, Workdir: s.Workdir,
		Resources: s.Resources, TimeoutMs: s.TimeoutMs, IdleTimeoutMs: s.IdleTimeoutMs,
		IdleAction: s.IdleAction, User: s.User, CreatedAtMs: rec.CreatedAtMs, ExpiresAtMs: rec.ExpiresAtMs,
		LastActiveAtMs: b.lastActive.Load(), StateDetail: rec.StateDetail, Stats: stats, ImageDigest: rec.ImageDigest,
		Network: policyProto(att.Policy), IpAddress: ipString(att.IP),
		Volumes: s.Volumes, Codebases: s.Codebases, Parent: b.parent, ScopedToken: b.tokenHash != "",
		AutoResume: s.AutoResume,
	}
	out.SecretNames = slices.Sorted(maps.Keys(s.Secrets))
	out.DomainSecrets = domainSecretsProto(s)
	out.PathPolicies = s.PathPolicies
	return proto.Clone(out).(*sbxv1.Sandbox)
}

func stateName(s sbxv1.SandboxState) string {
	switch s {
	case sbxv1.SandboxState_SANDBOX_STATE_CREATING:
		return "creating"
	case sbxv1.SandboxState_SANDBOX_STATE_RUNNING:
		return "running"
	case sbxv1.SandboxState_SANDBOX_STATE_STOPPED:
		return "stopped"
	case sbxv1.SandboxState_SANDBOX_STATE_DESTROYING:
		return "destroying"
	case sbxv1.SandboxState_SANDBOX_STATE_DESTROYED:
		return "destroyed"
	case sbxv1.SandboxState_SANDBOX_STATE_FAILED:
		return "failed"
	}
	return "unknown"
}

func stateOf(name string) sbxv1.SandboxState {
	for s := sbxv1.SandboxState_SANDBOX_STATE_CREATING; s <= sbxv1.SandboxState_SANDBOX_STATE_FAILED; s++ {
		if stateName(s) == name {
			return s
		}
	}
	return sbxv1.SandboxState_SANDBOX_STATE_UNSPECIFIED
}
