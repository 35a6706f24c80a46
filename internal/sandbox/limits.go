package sandbox

import (
	"context"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/runtime"
)

// LimitWatch tells, when a command of a sandbox ends, whether the
// sandbox's limits bit while it ran. Take one with WatchLimits just before
// the command starts and call Mark with its exit.
//
// The kernel counts OOM kills and refused forks per sandbox (its cgroup),
// not per process, so this is a heuristic: a command is told it was
// OOM-killed when it died by SIGKILL (or a shell reported a child so
// killed, exit code 137), it did not time out, and the sandbox's count of
// OOM kills rose while it ran. Two commands killed by one OOM event, or a
// command killed by `kill -9` while another process of the sandbox was
// OOM-killed, may both be told so. A `kill -9` with no OOM kill in its
// sandbox during the command is never reported as one. A failed command
// (non-zero exit) is told PidsLimitHit when some fork of the sandbox was
// refused while it ran.
//
// Cost: the counters (a few cgroup files) are read in the background as
// the command starts, off the exec's path, and read again only for a
// command that failed, so a successful exec waits for no read.
type LimitWatch struct {
	m  *Manager
	b  *box
	h  runtime.Handle
	le runtime.LimitEventer // nil: the driver cannot count (see Mark)
	// read is closed once start (and ok) are set.
	read  chan struct{}
	start runtime.LimitEvents
	ok    bool
}

// WatchLimits starts reading sandbox ref's limit counters as a command
// starts (nil, which Mark accepts, if ref is gone). The read runs beside
// the command's start: a command takes far longer to start and allocate
// than the read, so what it does is counted after the read.
func (m *Manager) WatchLimits(ctx context.Context, ref string) *LimitWatch {
	b, err := m.lookup(ctx, ref)
	if err != nil {
		return nil
	}
	b.mu.Lock()
	h := b.handle
	b.mu.Unlock()
	w := &LimitWatch{m: m, b: b, h: h}
	if le, ok := b.driver.(runtime.LimitEventer); ok {
		w.le, w.read = le, make(chan struct{})
		go func() {
			defer close(w.read)
			if ev, err := le.LimitEvents(ctx, h); err == nil {
				w.start, w.ok = ev, true
			}
		}()
	}
	return w
}

// Mark sets ex's oom_killed and pids_limit_hit (see LimitWatch). With a
// driver that cannot count per command it falls back on OOMKilled.
func (w *LimitWatch) Mark(ctx context.Context, ex *sbxv1.ExecExited) {
	if w == nil || ex == nil || (ex.GetExitCode() == 0 && ex.GetSignal() == 0) {
		return
	}
	killed := (ex.GetSignal() == 9 || ex.GetExitCode() == 137) && !ex.GetTimedOut()
	if w.le == nil {
		if killed && w.m.oomKilled(ctx, w.b) {
			ex.OomKilled = true
		}
		return
	}
	<-w.read
	if !w.ok {
		return
	}
	ev, err := w.le.LimitEvents(ctx, w.h)
	if err != nil {
		return
	}
	ex.OomKilled = killed && ev.OOMKills > w.start.OOMKills
	ex.PidsLimitHit = ev.PidsLimitHits > w.start.PidsLimitHits
	if ex.OomKilled || ex.PidsLimitHit {
		w.m.log.Info("command hit a sandbox limit", "sandbox", w.b.id, "oom_killed", ex.OomKilled,
			"pids_limit_hit", ex.PidsLimitHit, "exit_code", ex.GetExitCode())
	}
}

// entryMark is the limit flags given to one exit of a box's own command.
type entryMark struct {
	code, signal int32
	durationMs   int64
	oom, pids    bool
}

// MarkEntrypoint sets oom_killed and pids_limit_hit on ex, an exit of
// sandbox ref's own command (its entrypoint), as LimitWatch does for an
// exec but over the command's life: from the box's start (or the daemon's
// recovery of it) to the first time the daemon sees the exit, through Logs
// or Wait. What the first look found is kept, so every later Logs or Wait
// of the same exit says the same. With a driver that cannot count per
// command it falls back on the sandbox's OOM count since last looked at.
func (m *Manager) MarkEntrypoint(ctx context.Context, ref string, ex *sbxv1.ExecExited) {
	if ex == nil || (ex.GetExitCode() == 0 && ex.GetSignal() == 0) {
		return
	}
	b, err := m.lookup(ctx, ref)
	if err != nil {
		return
	}
	b.entryMu.Lock()
	defer b.entryMu.Unlock()
	if k := b.entryMark; k != nil && k.code == ex.GetExitCode() && k.signal == ex.GetSignal() && k.durationMs == ex.GetDurationMs() {
		ex.OomKilled, ex.PidsLimitHit = k.oom, k.pids
		return
	}
	killed := (ex.GetSignal() == 9 || ex.GetExitCode() == 137) && !ex.GetTimedOut()
	k := &entryMark{code: ex.GetExitCode(), signal: ex.GetSignal(), durationMs: ex.GetDurationMs()}
	b.mu.Lock()
	h := b.handle
	b.mu.Unlock()
	if le, ok := b.driver.(runtime.LimitEventer); ok {
		ev, err := le.LimitEvents(ctx, h)
		if err != nil {
			return // not kept: the next look tries again
		}
		k.oom = killed && ev.OOMKills > b.entryBase.OOMKills
		k.pids = ev.PidsLimitHits > b.entryBase.PidsLimitHits
	} else {
		k.oom = killed && m.oomKilled(ctx, b)
	}
	b.entryMark = k
	ex.OomKilled, ex.PidsLimitHit = k.oom, k.pids
	if k.oom || k.pids {
		m.log.Info("the sandbox's command hit a sandbox limit", "sandbox", b.id, "oom_killed", k.oom,
			"pids_limit_hit", k.pids, "exit_code", ex.GetExitCode())
	}
}
