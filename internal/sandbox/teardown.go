package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/crashpoint"
	"github.com/sbxdev/sbx/internal/runtime"
)

// A destroy answers once the sandbox is marked destroying in the store
// (with its name released) and dropped from memory; the box itself is torn
// down in the background: killed and its host resources released by the
// driver, its network detached, its codebase mounts removed and finally its
// record deleted. That is crash-safe because the mark comes first: a crash
// at any point of the teardown leaves the record saying destroying, and the
// next start's Recover finishes the teardown (it never re-attaches such a
// record), while each driver's Cleanup and the network's remove whatever a
// record no longer accounts for.
//
// At most teardownConcurrency teardowns run at once, so a burst of
// destroys does not take the CPU from the creates around it. A box whose
// driver killed every process of it first (runtime.Killer: one signal)
// holds no running code while it waits, only mounts, cgroups and its
// network: up to teardownKilledBacklog of those wait. Other boxes wait
// only while fewer than teardownBacklog are queued, beyond which Destroy
// tears down itself before answering (back-pressure: the boxes destroyed
// but still running stay few, whatever the rate of destroys). Close waits
// for every queued teardown, so a graceful stop leaves nothing of a
// destroyed box.

const (
	teardownConcurrency = 4
	teardownBacklog     = 64
	// teardownKilledBacklog bounds the queue for boxes killed before they
	// were queued (more than the largest burst of destroys measured, 1000).
	teardownKilledBacklog = 4096
	// teardownAttempts is how often a failing driver destroy is tried
	// before the record is left for the next start's recovery.
	teardownAttempts = 3
)

// teardowns is the background teardown queue.
type teardowns struct {
	wg sync.WaitGroup

	mu sync.Mutex
	// The fields below are guarded by mu.
	queue   []teardownJob
	workers int
	closed  bool
	// dying holds the boxes queued or being torn down, inline ones too, by
	// id (ImagesInUse counts them: their rootfs is still mounted).
	dying map[string]*box
	// drained is closed (and replaced) whenever dying becomes empty.
	drained chan struct{}
}

type teardownJob struct {
	b      *box
	reason string
}

// tearDownLater queues b's teardown and reports whether it did; it does
// not when the queue is full (for a killed box, teardownKilledBacklog;
// else teardownBacklog) or closed, and the caller tears down itself.
func (m *Manager) tearDownLater(b *box, reason string, killed bool) bool {
	t := &m.teardowns
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dying == nil {
		t.dying = map[string]*box{}
	}
	limit := teardownBacklog
	if killed {
		limit = teardownKilledBacklog
	}
	if t.closed || len(t.queue) >= limit {
		t.dying[b.id] = b
		return false
	}
	t.queue = append(t.queue, teardownJob{b, reason})
	t.dying[b.id] = b
	if t.workers < teardownConcurrency {
		t.workers++
		t.wg.Add(1)
		go m.teardownWorker()
	}
	return true
}

// kill has b's driver kill every process of b (runtime.Killer) and
// reports whether it did; drivers without it, and a kill that fails
// (logged), leave b running until its teardown.
func (m *Manager) kill(ctx context.Context, b *box) bool {
	k, ok := b.driver.(runtime.Killer)
	if !ok {
		return false
	}
	b.mu.Lock()
	h := b.handle
	b.mu.Unlock()
	if err := k.Kill(ctx, h); err != nil {
		m.log.Warn("killing a destroyed sandbox ahead of its teardown", "sandbox", b.id, "err", err)
		return false
	}
	return true
}

func (m *Manager) teardownWorker() {
	t := &m.teardowns
	defer t.wg.Done()
	for {
		t.mu.Lock()
		if len(t.queue) == 0 {
			t.workers--
			t.mu.Unlock()
			return
		}
		j := t.queue[0]
		t.queue[0] = teardownJob{}
		t.queue = t.queue[1:]
		t.mu.Unlock()
		m.tearDown(context.Background(), j.b, j.reason)
	}
}

// tearDown releases everything destroyed box b held and deletes its
// record. A driver that keeps failing leaves the record (state failed) for
// the next start's recovery to finish.
func (m *Manager) tearDown(ctx context.Context, b *box, reason string) {
	defer func() {
		t := &m.teardowns
		t.mu.Lock()
		delete(t.dying, b.id)
		if len(t.dying) == 0 && t.drained != nil {
			close(t.drained)
			t.drained = nil
		}
		t.mu.Unlock()
	}()
	b.mu.Lock()
	h := b.handle
	b.mu.Unlock()
	for attempt := 1; ; attempt++ {
		err := b.driver.Destroy(ctx, h)
		if err == nil {
			break
		}
		if attempt == teardownAttempts {
			m.log.Error("tearing down a destroyed sandbox failed; the next start retries", "sandbox", b.id, "err", err)
			_ = m.setState(ctx, b, sbxv1.SandboxState_SANDBOX_STATE_FAILED, "destroy failed: "+err.Error())
			return
		}
		m.log.Warn("tearing down a destroyed sandbox", "sandbox", b.id, "attempt", attempt, "err", err)
		time.Sleep(time.Duration(attempt) * 500 * time.Millisecond)
	}
	crashpoint.Hit("destroy-killed")
	m.detachNetwork(ctx, b.id)
	m.unmountCodebases(ctx, b.id)
	if err := m.cfg.Store.Delete(ctx, b.id); err != nil {
		m.log.Error("deleting the record of a destroyed sandbox", "sandbox", b.id, "err", err)
		return
	}
	crashpoint.Hit("destroy-unrecorded")
	m.log.Info("sandbox destroyed", "sandbox", b.id, "reason", reason)
}

// WaitTeardowns waits until no destroyed sandbox is still being torn down
// (or ctx ends). Destroy does not wait; this is for callers that must know
// a box's host resources are gone (tests, benchmarks).
func (m *Manager) WaitTeardowns(ctx context.Context) error {
	t := &m.teardowns
	t.mu.Lock()
	if len(t.dying) == 0 {
		t.mu.Unlock()
		return nil
	}
	if t.drained == nil {
		t.drained = make(chan struct{})
	}
	ch := t.drained
	t.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for sandbox teardowns: %w", ctx.Err())
	}
}

// closeTeardowns makes later destroys tear down inline and waits for the
// queued teardowns to end.
func (m *Manager) closeTeardowns() {
	t := &m.teardowns
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.wg.Wait()
}

// dyingImages adds to out the image digests of tenant's boxes still
// being torn down.
func (m *Manager) dyingImages(tenant string, out map[string]bool) {
	t := &m.teardowns
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, b := range t.dying {
		b.addImage(tenant, out)
	}
}
