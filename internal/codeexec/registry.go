package codeexec

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/store"
)

// attached is a live detached process the daemon is attached to: a
// context's kernel or a session's shell.
type attached interface {
	comparable
	// ident returns the process's id and its sandbox's id.
	ident() (id, sandbox string)
	// close kills the process and forgets its record.
	close()
	// detach ends this attachment, leaving the process and its record to
	// the replica that took it over.
	detach()
}

// registry keeps the live processes of one kind by id. A process whose
// record is persisted but that is not attached yet (its sandbox was
// stopped when the daemon started) is re-attached by restore when it is
// next looked up or listed. No lock is held while calling the store or
// restore.
type registry[T attached] struct {
	kind   string // store.ProcessContext or store.ProcessSession
	noun   string // "context" or "session": in errors and as the log key
	what   string // "code context" or "shell session": in log messages
	proc   string // "kernel" or "shell": what is gone when a record is dropped
	log    *slog.Logger
	agents Agents
	store  ProcessStore // nil: nothing is persisted
	// leaser is store when replicas share it (lease.go), holder this
	// replica's name in its leases.
	leaser ProcessLeaser
	holder string
	// restore re-attaches r's process and registers it with put (before it
	// starts reading, so a stream that ends at once is dropped). A process
	// that is gone wraps errdefs.ErrNotFound.
	restore func(ctx context.Context, r *store.ProcessRecord) error

	// restoreMu serializes re-attaching, so a process is restored once.
	restoreMu sync.Mutex
	mu        sync.Mutex
	live      map[string]T
	busy      map[string]*idLock // lockID's locks
}

// lookup returns the live process id, if there is one.
func (g *registry[T]) lookup(id string) (T, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	v, ok := g.live[id]
	return v, ok
}

// put registers v as live.
func (g *registry[T]) put(v T) {
	id, _ := v.ident()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.live[id] = v
}

// drop removes v from the live processes (unless another one took its id).
func (g *registry[T]) drop(v T) {
	id, _ := v.ident()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.live[id] == v {
		delete(g.live, id)
	}
}

// all returns the live processes.
func (g *registry[T]) all() []T {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]T, 0, len(g.live))
	for _, v := range g.live {
		out = append(out, v)
	}
	return out
}

// get returns a live process, re-attaching a persisted one that is not
// attached yet (its sandbox was stopped when the daemon started).
func (g *registry[T]) get(ctx context.Context, id string) (T, error) {
	var zero T
	notFound := fmt.Errorf("%s %s: %w", g.noun, id, errdefs.ErrNotFound)
	if v, ok := g.lookup(id); ok {
		if _, sb := v.ident(); !g.agents.Sees(ctx, sb) {
			return zero, notFound
		}
		return v, nil
	}
	if g.store == nil {
		return zero, notFound
	}
	r, err := g.store.GetProcess(ctx, id)
	if errdefs.IsNotFound(err) || err == nil && (r.Kind != g.kind || !g.agents.Sees(ctx, r.SandboxID)) {
		return zero, notFound
	}
	if err != nil {
		return zero, fmt.Errorf("%s %s: %w", g.noun, id, err)
	}
	if err := g.restoreRecord(ctx, r); errdefs.IsNotFound(err) {
		return zero, notFound
	} else if err != nil {
		return zero, fmt.Errorf("%s %s: %w", g.noun, id, err)
	}
	if v, ok := g.lookup(id); ok {
		return v, nil
	}
	return zero, notFound
}

// restoreAll re-attaches the processes of every persisted record (after
// the sandboxes were recovered). A record whose process is gone is dropped
// with a log line; one whose sandbox cannot be reached now is kept for a
// later try.
func (g *registry[T]) restoreAll(ctx context.Context) error {
	if g.store == nil || g.leaser != nil {
		// Shared: another replica may be attached to them; each is
		// attached when it is next used (use).
		return nil
	}
	recs, err := g.store.ListProcesses(ctx, g.kind)
	if err != nil {
		return fmt.Errorf("restore %ss: %w", g.noun, err)
	}
	for _, r := range recs {
		if err := g.restoreRecord(ctx, r); err != nil && !errdefs.IsNotFound(err) {
			g.log.Info(g.what+" kept for later: its sandbox cannot be reached now", g.noun, r.ID, "sandbox", r.SandboxID, "err", err)
		}
	}
	return nil
}

// restoreRecord re-attaches r's process unless that was done already. A
// process or sandbox that is gone has its record dropped; one whose
// sandbox is not running now keeps its record for a later try.
func (g *registry[T]) restoreRecord(ctx context.Context, r *store.ProcessRecord) error {
	g.restoreMu.Lock()
	defer g.restoreMu.Unlock()
	if _, ok := g.lookup(r.ID); ok {
		return nil
	}
	err := g.restore(ctx, r)
	switch {
	case err == nil:
	case errdefs.IsNotFound(err):
		g.log.Warn(g.what+" dropped: its "+g.proc+" is gone", g.noun, r.ID, "sandbox", r.SandboxID, "err", err)
		forgetProcess(g.agents, g.store, g.log, r.SandboxID, r.ID)
	default:
		g.log.Debug(g.what+" not re-attached", g.noun, r.ID, "sandbox", r.SandboxID, "err", err)
	}
	return err
}

// restorePending re-attaches the persisted processes (of one sandbox if
// sandbox is set) that are not attached: their sandbox was stopped when the
// daemon started and may run again.
func (g *registry[T]) restorePending(sandbox string) {
	if g.store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	recs, err := g.store.ListProcesses(ctx, g.kind)
	if err != nil {
		g.log.Warn("listing "+g.noun+" records", "err", err)
		return
	}
	for _, r := range recs {
		if sandbox != "" && r.SandboxID != sandbox {
			continue
		}
		if _, ok := g.lookup(r.ID); !ok {
			_ = g.restoreRecord(ctx, r)
		}
	}
}

// list restores the pending processes, then returns the live ones (of one
// sandbox if sandbox is set) that ctx's caller may see.
// With a shared store, the records of the processes that are not live here
// (another replica opened them, or had them last) come back too: listing
// attaches to nothing.
func (g *registry[T]) list(ctx context.Context, sandbox string) ([]T, []*store.ProcessRecord) {
	if g.leaser == nil {
		g.restorePending(sandbox)
	}
	var out []T
	live := map[string]bool{}
	for _, v := range g.all() {
		id, sb := v.ident()
		live[id] = true
		if (sandbox == "" || sb == sandbox) && g.agents.Sees(ctx, sb) {
			out = append(out, v)
		}
	}
	if g.leaser == nil {
		return out, nil
	}
	recs, err := g.store.ListProcesses(ctx, g.kind)
	if err != nil {
		g.log.Warn("listing "+g.noun+" records", "err", err)
		return out, nil
	}
	var others []*store.ProcessRecord
	for _, r := range recs {
		if !live[r.ID] && (sandbox == "" || r.SandboxID == sandbox) && g.agents.Sees(ctx, r.SandboxID) {
			others = append(others, r)
		}
	}
	return out, others
}

// close kills a live process, or forgets a persisted one that is not
// attached (its sandbox was stopped at restore), if ctx's caller may see it.
func (g *registry[T]) close(ctx context.Context, id string) error {
	notFound := fmt.Errorf("%s %s: %w", g.noun, id, errdefs.ErrNotFound)
	closed := false
	if v, ok := g.lookup(id); ok {
		if _, sb := v.ident(); !g.agents.Sees(ctx, sb) {
			return notFound
		}
		v.close() // forgets the record first: a list meanwhile does not restore it
		g.drop(v)
		if g.leaser == nil {
			return nil
		}
		// Shared: another replica may have taken it over meanwhile, and
		// this close then left it alone; forget it through its record.
		closed = true
	}
	if g.store != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if r, err := g.store.GetProcess(sctx, id); err == nil && r.Kind == g.kind && g.agents.Sees(ctx, r.SandboxID) {
			forgetProcess(g.agents, g.store, g.log, r.SandboxID, r.ID)
			return nil
		}
	}
	if closed {
		return nil
	}
	return notFound
}
