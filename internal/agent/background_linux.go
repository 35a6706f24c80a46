package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	agentv1 "github.com/sbxdev/sbx/api/gen/agent/v1"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// Background processes (StartProcess, ProcessLogs, ProcessInput,
// WaitProcess; protocol 4) are detached processes of a second kind: they
// share the detached processes' ids, ListDetached and RemoveDetached, but
// their output goes to a logRing like the entrypoint's (an entryProc), so
// any number of clients replay and follow it without consuming it, input
// comes in unary calls, and the exit status stays for every waiter until
// the record is reaped: exitedBackgroundTTL after the exit, or sooner when
// more than maxExitedBackground exited ones are kept (the oldest go first).
// Nothing a reader does holds the process back: the ring never blocks it.

// The agent's own bounds on background processes, whatever the daemon asks.
const (
	// maxBackground bounds running background processes.
	maxBackground = 1024
	// maxExitedBackground bounds the exited ones whose status is kept.
	maxExitedBackground = 64
	// exitedBackgroundTTL is how long an exited one's status is kept.
	exitedBackgroundTTL = 15 * time.Minute
	// maxProcessInputs bounds the events of one ProcessInput call.
	maxProcessInputs = 64
	// maxTagBytes bounds a background process's tag.
	maxTagBytes = 256
	// stdinWriteTimeout bounds how long ProcessInput waits for a process
	// to take its stdin.
	stdinWriteTimeout = 5 * time.Second
)

// The output rings of background processes are the agent's memory, which
// lives in the agent's reserve beside user code (at most 32 MiB, a quarter
// of a small box's memory), so all of them together hold at most
// backgroundBudget bytes: each stream of each of n kept processes keeps
// backgroundOutput bytes, or budget/2n if less, but at least
// minBackgroundOutput (so at most 1088 × 2 × 2 KiB at the agent's bounds).
// Pieces are bounded too (ringChunks), since a process writing a byte at a
// time makes a piece per byte. (Variables for tests.)
var (
	// backgroundReadSize is each pump's buffer (two a process): smaller
	// than the entrypoint's, as there may be a thousand.
	backgroundReadSize  = 16 << 10
	backgroundOutput    = 256 << 10
	backgroundBudget    = 4 << 20
	minBackgroundOutput = 2 << 10
)

// ringLimits returns the per-stream byte bound and the piece bound of each
// ring when n background processes are kept.
func ringLimits(n int) (limit, chunks int) {
	limit = min(backgroundOutput, max(minBackgroundOutput, backgroundBudget/(2*max(n, 1))))
	// A piece costs about 80 bytes besides its data.
	return limit, max(32, limit/64)
}

// bgProc is one background process.
type bgProc struct {
	*entryProc
	id      string
	tag     string
	env     map[string]string // the request's, as given
	workdir string            // the request's, as given

	// inMu serializes input (so that two clients' stdin never interleaves
	// within a call) and guards stdinOpen.
	inMu      sync.Mutex
	stdinOpen bool

	// exitedAt is when the exit was recorded; zero while running.
	// Guarded by the detachedTable's mu.
	exitedAt time.Time
}

// validTag reports whether tag is a valid background process tag.
func validTag(tag string) error {
	switch {
	case len(tag) > maxTagBytes:
		return fmt.Errorf("tag is %d bytes, more than %d", len(tag), maxTagBytes)
	case !utf8.ValidString(tag):
		return errors.New("tag is not UTF-8")
	case slices.Contains([]byte(tag), 0):
		return errors.New("tag contains a NUL byte")
	}
	return nil
}

// StartProcess starts a background process (see agent.proto).
func (s *Server) StartProcess(_ context.Context, req *connect.Request[agentv1.StartProcessRequest]) (*connect.Response[agentv1.StartProcessResponse], error) {
	id, ex := req.Msg.GetId(), req.Msg.GetExec()
	if !validDetachedID(id) {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("start process: invalid process id %q (want 1 to 128 of A-Z a-z 0-9 . _ -)", id))
	}
	if err := validateExec(ex); err != nil {
		return nil, err
	}
	if ex.GetTimeoutMs() < 0 {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("start process: timeout %dms must not be negative", ex.GetTimeoutMs()))
	}
	if err := validTag(req.Msg.GetTag()); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("start process: %w", err))
	}
	limit := maxBackground
	if m := int(req.Msg.GetMaxRunning()); m > 0 && m < limit {
		limit = m
	}
	d, err := s.startBackground(id, req.Msg.GetTag(), ex, limit)
	if se, ok := errors.AsType[*startError](err); ok {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("start process: %w (exit code %d)", se, se.code))
	}
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&agentv1.StartProcessResponse{Process: s.backgroundInfo(d)}), nil
}

// startBackground starts ex as background process id, unless limit run.
func (s *Server) startBackground(id, tag string, ex *sbxv1.ExecRequest, limit int) (*bgProc, error) {
	t := &s.detached
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.procs[id] != nil || t.bg[id] != nil {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("start process: process %q already exists", id))
	}
	running := 0
	for _, d := range t.bg {
		if d.exitedAt.IsZero() {
			running++
		}
	}
	if running >= limit {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("start process: %d background processes already run, the most allowed", running))
	}
	p, err := s.start(ex)
	if err != nil {
		return nil, err
	}
	argv := ex.GetArgv()
	if ex.GetShell() != "" {
		argv = []string{"/bin/sh", "-c", ex.GetShell()}
	}
	// Every ring shrinks to make room for the new one's share of the budget.
	limit, chunks := ringLimits(len(t.bg) + 1)
	for _, o := range t.bg {
		o.mu.Lock()
		if o.log.limit > limit {
			o.log.setLimit(limit, chunks)
			o.cond.Broadcast()
		}
		o.mu.Unlock()
	}
	e := newEntryProc(s, argv, p, limit, chunks, backgroundReadSize)
	d := &bgProc{entryProc: e, id: id, tag: tag, env: maps.Clone(ex.GetEnv()), workdir: ex.GetWorkdir()}
	p.initialStdin(ex)
	d.stdinOpen = p.stdin != nil && (ex.GetStdinOpen() || ex.GetTty())
	if t.bg == nil {
		t.bg = map[string]*bgProc{}
	}
	t.bg[id] = d
	var timeout *time.Timer
	if ms := ex.GetTimeoutMs(); ms > 0 {
		timeout = time.AfterFunc(time.Duration(ms)*time.Millisecond, func() {
			e.timedOut.Store(true)
			p.kill()
		})
	}
	go func() {
		e.watch()
		if timeout != nil {
			timeout.Stop()
		}
		s.backgroundExited(d)
	}()
	s.log.Info("background process started", "id", id, "pid", p.pid)
	return d, nil
}

// backgroundExited records d's exit (its status is recorded and its output
// read): it is forgotten after exitedBackgroundTTL, and the oldest exited
// ones beyond maxExitedBackground are forgotten now.
func (s *Server) backgroundExited(d *bgProc) {
	t := &s.detached
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.bg[d.id] != d {
		return // removed
	}
	d.exitedAt = time.Now()
	var exited []*bgProc
	for _, o := range t.bg {
		if !o.exitedAt.IsZero() {
			exited = append(exited, o)
		}
	}
	if over := len(exited) - maxExitedBackground; over > 0 {
		slices.SortFunc(exited, func(a, b *bgProc) int { return a.exitedAt.Compare(b.exitedAt) })
		for _, o := range exited[:over] {
			delete(t.bg, o.id)
		}
	}
	time.AfterFunc(exitedBackgroundTTL, func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.bg[d.id] == d {
			delete(t.bg, d.id)
		}
	})
}

// lookupBackground returns background process id or a NotFound error
// prefixed with op.
func (s *Server) lookupBackground(op, id string) (*bgProc, error) {
	s.detached.mu.Lock()
	d := s.detached.bg[id]
	s.detached.mu.Unlock()
	if d == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("%s: no background process %q", op, id))
	}
	return d, nil
}

// backgroundInfo describes d for ListDetached and the process calls.
func (s *Server) backgroundInfo(d *bgProc) *agentv1.DetachedProcess {
	s.detached.mu.Lock()
	exitedAt := d.exitedAt
	s.detached.mu.Unlock()
	d.inMu.Lock()
	stdinOpen := d.stdinOpen
	d.inMu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	dropped := d.log.dropped()
	dp := &agentv1.DetachedProcess{
		Id: d.id, Pid: int32(d.p.pid), Command: d.argv, StartedMs: d.p.started.UnixMilli(),
		BufferedBytes: uint64(d.log.size[0] + d.log.size[1]),
		Background:    true, Tag: d.tag, Tty: d.p.tty, StdinOpen: stdinOpen && d.exit == nil,
		DroppedStdout: dropped[0], DroppedStderr: dropped[1], Env: d.env, Workdir: d.workdir,
	}
	if d.exit != nil {
		dp.Exited, dp.ExitCode, dp.Signal = true, d.exit.GetExitCode(), d.exit.GetSignal()
		dp.Exit = d.exit
		if !exitedAt.IsZero() {
			dp.ExitedMs = exitedAt.UnixMilli()
		}
	}
	return dp
}

// ProcessLogs streams a background process's output ring.
func (s *Server) ProcessLogs(ctx context.Context, req *connect.Request[agentv1.ProcessLogsRequest], out *connect.ServerStream[sbxv1.LogsEvent]) error {
	d, err := s.lookupBackground("process logs", req.Msg.GetId())
	if err != nil {
		return err
	}
	lr := req.Msg.GetLogs()
	if lr == nil {
		lr = &sbxv1.LogsRequest{}
	}
	return d.logs(ctx, lr, out.Send)
}

// ProcessInput applies input events to a background process.
func (s *Server) ProcessInput(ctx context.Context, req *connect.Request[agentv1.ProcessInputRequest]) (*connect.Response[agentv1.ProcessInputResponse], error) {
	d, err := s.lookupBackground("process input", req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	ins := req.Msg.GetInputs()
	if len(ins) > maxProcessInputs {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("process input: %d events, more than %d", len(ins), maxProcessInputs))
	}
	d.inMu.Lock()
	defer d.inMu.Unlock()
	for _, in := range ins {
		if err := d.input(ctx, in); err != nil {
			return nil, err
		}
	}
	return connect.NewResponse(&agentv1.ProcessInputResponse{}), nil
}

// input applies one input event. d.inMu must be held.
func (d *bgProc) input(ctx context.Context, in *sbxv1.ExecInput) error {
	p := d.p
	switch ev := in.GetEvent().(type) {
	case *sbxv1.ExecInput_Stdin:
		switch {
		case !d.stdinOpen:
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process input: the stdin of process %s is closed (start it with stdin_open or a tty to write to it later)", d.id))
		case p.exited.Load():
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process input: process %s has exited", d.id))
		}
		return d.writeStdin(ctx, ev.Stdin)
	case *sbxv1.ExecInput_StdinClose:
		if ev.StdinClose && d.stdinOpen {
			p.closeStdin()
			d.stdinOpen = false
		}
	case *sbxv1.ExecInput_Resize:
		if !p.tty {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process input: process %s has no terminal to resize", d.id))
		}
		if !p.exited.Load() {
			if err := setPTYSize(p.stdout, ev.Resize); err != nil {
				return connect.NewError(connect.CodeInternal, fmt.Errorf("process input: %w", err))
			}
		}
	case *sbxv1.ExecInput_Signal:
		if ev.Signal < 1 || ev.Signal > 64 {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("process input: signal %d is not 1 to 64", ev.Signal))
		}
		p.apply(in)
	default:
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("process input: event %T is not stdin, stdin_close, resize or signal", ev))
	}
	return nil
}

// writeStdin writes data to d's stdin, waiting at most stdinWriteTimeout
// (or until ctx ends) for the process to take it.
func (d *bgProc) writeStdin(ctx context.Context, data []byte) error {
	f := d.p.stdin
	deadline := time.Now().Add(stdinWriteTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	if err := f.SetWriteDeadline(deadline); err != nil {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process input: process %s: %w", d.id, err))
	}
	defer f.SetWriteDeadline(time.Time{})
	n, err := f.Write(data)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("process input: process %s did not read its stdin in time (%d of %d bytes written)", d.id, n, len(data)))
	default:
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process input: writing to the stdin of process %s (%d of %d bytes written): %w", d.id, n, len(data), err))
	}
}

// WaitProcess returns once a background process has exited.
func (s *Server) WaitProcess(ctx context.Context, req *connect.Request[agentv1.WaitProcessRequest]) (*connect.Response[agentv1.WaitProcessResponse], error) {
	d, err := s.lookupBackground("wait process", req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	if d.wait(ctx) == nil {
		return nil, ctx.Err()
	}
	return connect.NewResponse(&agentv1.WaitProcessResponse{Process: s.backgroundInfo(d)}), nil
}

// removeBackground kills background process id's group and forgets it;
// false if there is none.
func (s *Server) removeBackground(id string) bool {
	s.detached.mu.Lock()
	d := s.detached.bg[id]
	delete(s.detached.bg, id)
	s.detached.mu.Unlock()
	if d == nil {
		return false
	}
	d.p.kill()
	s.log.Info("background process removed", "id", id, "pid", d.p.pid)
	return true
}

// listBackground describes the background processes.
func (s *Server) listBackground() []*agentv1.DetachedProcess {
	s.detached.mu.Lock()
	procs := make([]*bgProc, 0, len(s.detached.bg))
	for _, d := range s.detached.bg {
		procs = append(procs, d)
	}
	s.detached.mu.Unlock()
	out := make([]*agentv1.DetachedProcess, 0, len(procs))
	for _, d := range procs {
		out = append(out, s.backgroundInfo(d))
	}
	return out
}
