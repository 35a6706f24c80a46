package sandbox

import (
	"context"
	"errors"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/runtime"
)

// watch has the driver tell when box b's init (its agent) exits on its own
// (runtime.Watcher; drivers without it are not watched): the sandbox is
// then marked failed with what happened, and execs fail at once naming it
// instead of timing out on an agent that is gone (attack class 5). prefix
// starts the reason ("agent died" while the daemon watched; recovery says
// the daemon was down). Each watched box costs one goroutine here, parked on
// a channel, and whatever the driver parks (the oci driver: one goroutine
// on a pidfd in the netpoller); both end when the init exits or the
// manager closes. It returns whether the init had already exited, in which
// case b is marked before watch returns. The caller holds b.opMu, or b is
// not yet reachable by anyone else (recovery).
func (m *Manager) watch(b *box, prefix string) (exited bool) {
	w, ok := b.driver.(runtime.Watcher)
	if !ok {
		return false
	}
	b.mu.Lock()
	h := b.handle
	b.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := w.Watch(ctx, h)
	if err != nil {
		cancel()
		if !errors.Is(err, errors.ErrUnsupported) {
			m.log.Warn("cannot watch the sandbox's agent", "sandbox", b.id, "err", err)
		}
		return false
	}
	select {
	case ex, ok := <-ch:
		cancel()
		if ok {
			m.agentExited(b, prefix, ex, false)
		}
		return ok
	default:
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer cancel()
		select {
		case <-m.stop:
		case ex, ok := <-ch:
			if ok {
				m.agentExited(b, "agent died", ex, true)
			}
		}
	}()
	return false
}

// agentExited marks b failed because its init ended, unless b is being
// destroyed (which kills the init) or is no longer running. lock says
// whether to take b.opMu (the watch goroutine must; recovery runs before
// anything else can hold it).
func (m *Manager) agentExited(b *box, prefix string, ex runtime.Exit, lock bool) {
	if lock {
		b.opMu.Lock()
		defer b.opMu.Unlock()
	}
	st := b.state()
	if st != sbxv1.SandboxState_SANDBOX_STATE_RUNNING && st != sbxv1.SandboxState_SANDBOX_STATE_STOPPED {
		return
	}
	reason := prefix + ": the sandbox's agent (its init) " + ex.Reason
	b.mu.Lock()
	conn := b.conn
	b.conn = nil
	b.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
	ctx := context.Background()
	if err := m.setState(ctx, b, sbxv1.SandboxState_SANDBOX_STATE_FAILED, reason); err != nil {
		m.log.Error("marking a sandbox whose agent died", "sandbox", b.id, "err", err)
	}
	m.log.Warn("sandbox failed", "sandbox", b.id, "reason", reason, "signal", ex.Signal, "oom_killed", ex.OOMKilled)
	m.emit(b, sbxv1.EventType_EVENT_TYPE_FAILED, exitReason(ex), reason)
}
