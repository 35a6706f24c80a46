package codeexec

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/store"
)

// Replicas sharing one store (`sbx serve --state kubernetes`) share the
// sessions and contexts too: the record is the truth, and the process in
// the box is reached through its agent by whichever replica a request
// lands on. The agent lets one client attach at a time (a new Attach takes
// the process over; the old stream ends with Aborted), so a replica
// attaches only while it holds the record's lease (ProcessLeaser), which
// it takes for one command and gives back after it: commands from two
// replicas run one after the other, never with their output interleaved,
// and a replica killed mid-command loses its lease when it expires
// (leaseTerm). A replica whose attachment another replica took over drops
// it without touching the process or its record.

// ProcessLeaser is a ProcessStore that several replicas share
// (kubestore): it keeps a lease in each record.
type ProcessLeaser interface {
	// LeaseProcess takes id's lease for holder until until; another
	// holder's unexpired lease refuses it, wrapping errdefs.ErrUnavailable.
	// It returns the holder that took it before ("" if none did).
	LeaseProcess(ctx context.Context, id, holder string, until time.Time) (last string, err error)
	// ReleaseProcess gives back holder's lease of id.
	ReleaseProcess(ctx context.Context, id, holder string) error
}

var (
	// leaseTerm is how long a lease lasts unless renewed: how long a
	// command waits for a replica that died holding it.
	leaseTerm = 30 * time.Second
	// leasePoll bounds the wait between tries for a lease in use.
	leasePoll = 250 * time.Millisecond
)

// useStore makes g persist its records in st, and share them with other
// replicas when st is a ProcessLeaser.
func (g *registry[T]) useStore(st ProcessStore) {
	g.store = st
	if l, ok := st.(ProcessLeaser); ok {
		g.leaser, g.holder = l, "replica-"+newID()
	}
}

// newLease is the lease a record of a process this replica just started
// carries: it is attached here, so its first command needs no re-attach.
func (g *registry[T]) newLease() store.ProcessLease {
	return store.ProcessLease{Last: g.holder}
}

// use runs fn with the live process id, as ctx's caller may see it. With
// a shared store it holds id's lease meanwhile, and re-attaches the
// process when another replica had it since this one last did.
func (g *registry[T]) use(ctx context.Context, id string, fn func(T) error) error {
	if g.leaser == nil {
		v, err := g.get(ctx, id)
		if err != nil {
			return err
		}
		return fn(v)
	}
	unlock := g.lockID(id)
	defer unlock()
	notFound := fmt.Errorf("%s %s: %w", g.noun, id, errdefs.ErrNotFound)
	r, err := g.store.GetProcess(ctx, id)
	if errdefs.IsNotFound(err) || err == nil && (r.Kind != g.kind || !g.agents.Sees(ctx, r.SandboxID)) {
		return notFound
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", g.noun, id, err)
	}
	last, err := g.lease(ctx, id)
	if err != nil {
		return err
	}
	stop := g.renew(id)
	defer func() {
		stop()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := g.leaser.ReleaseProcess(rctx, id, g.holder); err != nil {
			g.log.Warn("releasing the lease of a "+g.what, g.noun, id, "err", err)
		}
	}()
	if v, ok := g.lookup(id); ok && last != g.holder {
		// Another replica attached since: this stream is no longer the
		// process's (or will not be once the agent says so).
		v.detach()
		g.drop(v)
	}
	v, err := g.get(ctx, id)
	if err != nil {
		return err
	}
	return fn(v)
}

// lease takes id's lease, waiting while another replica holds it.
func (g *registry[T]) lease(ctx context.Context, id string) (last string, err error) {
	wait := 20 * time.Millisecond
	for {
		last, err := g.leaser.LeaseProcess(ctx, id, g.holder, time.Now().Add(leaseTerm))
		switch {
		case err == nil:
			return last, nil
		case errdefs.IsNotFound(err):
			return "", fmt.Errorf("%s %s: %w", g.noun, id, errdefs.ErrNotFound)
		case !errors.Is(err, errdefs.ErrUnavailable):
			return "", fmt.Errorf("%s %s: taking its lease: %w", g.noun, id, err)
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%s %s: waiting for another replica's command to end: %w", g.noun, id, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, leasePoll)
	}
}

// renew keeps id's lease while a command runs, until stop is called.
func (g *registry[T]) renew(id string) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(leaseTerm / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				ctx, cancel := context.WithTimeout(context.Background(), leaseTerm/3)
				if _, err := g.leaser.LeaseProcess(ctx, id, g.holder, time.Now().Add(leaseTerm)); err != nil {
					g.log.Warn("renewing the lease of a "+g.what, g.noun, id, "err", err)
				}
				cancel()
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// lockID serialises this replica's commands in process id, so that one
// lease stands for one command.
func (g *registry[T]) lockID(id string) (unlock func()) {
	g.mu.Lock()
	if g.busy == nil {
		g.busy = map[string]*idLock{}
	}
	l := g.busy[id]
	if l == nil {
		l = &idLock{}
		g.busy[id] = l
	}
	l.refs++
	g.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		g.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(g.busy, id)
		}
		g.mu.Unlock()
	}
}

// idLock is a reference-counted lock of one id.
type idLock struct {
	mu   sync.Mutex
	refs int // guarded by the registry's mu
}
