package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	agentv1 "github.com/sbxdev/sbx/api/gen/agent/v1"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// Detached processes (Attach, ListDetached, RemoveDetached) are execs that
// outlive their stream: the daemon's shell sessions and code kernels, which
// must survive a daemon restart. While no client is attached their output
// goes to an outBuf; the exit status is kept until a client has been sent
// it (or RemoveDetached), so a daemon that comes back learns how the
// process ended.

// maxDetached bounds how many detached processes (running or not yet
// collected) one agent keeps.
const maxDetached = 256

// detachedTable is the agent's detached processes by id: Attach's, and
// the background processes (background_linux.go), which share the ids.
type detachedTable struct {
	mu    sync.Mutex
	procs map[string]*detachedProc
	bg    map[string]*bgProc
}

// detachedProc is one detached process.
type detachedProc struct {
	pumped
	id   string
	argv []string
	// limit is how much of each stream out keeps while nobody is attached.
	limit int

	// These are guarded by mu.
	out     outBuf
	owner   uint64 // generation of the attached client; 0: none
	gen     uint64
	removed bool
}

// validDetachedID reports whether id is 1 to 128 bytes of [A-Za-z0-9._-].
func validDetachedID(id string) bool {
	if len(id) == 0 || len(id) > 128 {
		return false
	}
	for _, c := range []byte(id) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// Attach starts or re-attaches to a detached process (see agent.proto).
func (s *Server) Attach(ctx context.Context, stream *connect.BidiStream[agentv1.AttachInput, agentv1.AttachOutput]) error {
	first, err := stream.Receive()
	if errors.Is(err, io.EOF) {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("attach: stream ended before start"))
	}
	if err != nil {
		return fmt.Errorf("receiving attach start: %w", err)
	}
	start := first.GetStart()
	if start == nil {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("first attach message must be start"))
	}
	id := start.GetId()
	if !validDetachedID(id) {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("attach: invalid process id %q (want 1 to 128 of A-Z a-z 0-9 . _ -)", id))
	}
	req := start.GetExec()
	if req == nil {
		d := s.lookupDetached(id)
		if d == nil {
			return connect.NewError(connect.CodeNotFound, fmt.Errorf("attach: no detached process %q", id))
		}
		return d.serve(ctx, s, stream, false)
	}
	if err := validateExec(req); err != nil {
		return err
	}
	if req.GetTimeoutMs() != 0 {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("attach: a detached process has no timeout (timeout_ms must be 0)"))
	}
	d, err := s.startDetached(id, req)
	if se, ok := errors.AsType[*startError](err); ok {
		return stream.Send(&agentv1.AttachOutput{Event: &agentv1.AttachOutput_Output{Output: &sbxv1.ExecOutput{
			Event: &sbxv1.ExecOutput_Exited{Exited: &sbxv1.ExecExited{ExitCode: se.code, Error: se.Error()}},
		}}})
	}
	if ce := new(connect.Error); errors.As(err, &ce) {
		return err
	}
	if err != nil {
		return connect.NewError(connect.CodeInternal, err)
	}
	d.p.initialStdin(req)
	return d.serve(ctx, s, stream, true)
}

// startDetached starts req as detached process id.
func (s *Server) startDetached(id string, req *sbxv1.ExecRequest) (*detachedProc, error) {
	t := &s.detached
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.procs[id] != nil || t.bg[id] != nil {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("attach: detached process %q already exists", id))
	}
	if len(t.procs) >= maxDetached {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("attach: already %d detached processes", maxDetached))
	}
	p, err := s.start(req)
	if err != nil {
		return nil, err
	}
	argv := req.GetArgv()
	if req.GetShell() != "" {
		argv = []string{"/bin/sh", "-c", req.GetShell()}
	}
	return s.adoptLocked(id, argv, p, true), nil
}

// adoptLocked makes the started process p detached process id: its output
// goes to the detached buffer (bounded while nobody is attached) and its
// exit is kept for a client. With claimed, the process starts owned by
// generation 1, the client that started it (see serve), so that none of its
// first output is dropped before that client's serve runs.
// s.detached.mu must be held.
func (s *Server) adoptLocked(id string, argv []string, p *process, claimed bool) *detachedProc {
	t := &s.detached
	d := &detachedProc{id: id, argv: slices.Clone(argv), limit: s.outputLimit}
	if claimed {
		d.gen, d.owner = 1, 1
	}
	d.init(p, 0)
	if t.procs == nil {
		t.procs = map[string]*detachedProc{}
	}
	t.procs[id] = d
	d.startPumps(s, d.put)
	go d.watch()
	s.log.Info("detached process started", "id", id, "pid", p.pid)
	return d
}

func (s *Server) lookupDetached(id string) *detachedProc {
	s.detached.mu.Lock()
	defer s.detached.mu.Unlock()
	return s.detached.procs[id]
}

// collect forgets d once its exit status has been delivered.
func (s *Server) collect(d *detachedProc) {
	s.detached.mu.Lock()
	defer s.detached.mu.Unlock()
	if s.detached.procs[d.id] == d {
		delete(s.detached.procs, d.id)
	}
}

// put stores a pump's data (d.mu held). While a client is attached and
// the stream's buffer is full it waits for the client (back-pressure
// instead of loss).
func (d *detachedProc) put(stderr bool, data []byte) {
	for d.owner != 0 && !d.removed && d.out.full(stderr, d.limit) {
		d.cond.Wait()
	}
	limit := d.limit
	if d.owner != 0 {
		// The wait above made room; an attached client loses nothing.
		limit += len(data)
	}
	d.out.add(stderr, data, limit)
}

// serve attaches the stream to d: it sends attached, then buffered and live
// output, keepalives when idle, and finally the exited event, after which
// d is collected. Inputs are applied while this stream is the attached one.
func (d *detachedProc) serve(ctx context.Context, s *Server, stream *connect.BidiStream[agentv1.AttachInput, agentv1.AttachOutput], claimed bool) error {
	d.mu.Lock()
	if d.removed {
		d.mu.Unlock()
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("attach: detached process %q was removed", d.id))
	}
	// A client that started the process owns it from the start (generation
	// 1, see adoptLocked); one that attaches takes it over.
	if !claimed {
		d.gen++
	}
	me := d.gen
	d.owner = me
	dropOut, dropErr := d.out.takeDropped()
	d.cond.Broadcast()
	d.mu.Unlock()
	wake := func() {
		d.mu.Lock()
		d.cond.Broadcast()
		d.mu.Unlock()
	}
	defer func() {
		d.mu.Lock()
		if d.owner == me {
			d.owner = 0
		}
		d.cond.Broadcast()
		d.mu.Unlock()
	}()
	defer context.AfterFunc(ctx, wake)()
	quit := make(chan struct{})
	defer close(quit)
	go func() {
		t := time.NewTicker(keepaliveIdle)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				wake()
			case <-quit:
				return
			}
		}
	}()

	if err := stream.Send(&agentv1.AttachOutput{Event: &agentv1.AttachOutput_Attached{Attached: &agentv1.AttachAttached{
		Pid: int32(d.p.pid), DroppedStdout: dropOut, DroppedStderr: dropErr,
	}}}); err != nil {
		return err
	}
	go func() {
		for {
			msg, err := stream.Receive()
			if err != nil {
				return
			}
			in := msg.GetInput()
			if in == nil {
				continue
			}
			d.mu.Lock()
			mine := d.owner == me
			d.mu.Unlock()
			if !mine {
				return
			}
			d.p.apply(in)
		}
	}()
	send := func(o *sbxv1.ExecOutput) error {
		return stream.Send(&agentv1.AttachOutput{Event: &agentv1.AttachOutput_Output{Output: o}})
	}
	lastSend := time.Now()
	for {
		d.mu.Lock()
		for d.owner == me && !d.removed && ctx.Err() == nil && len(d.out.chunks) == 0 && d.exit == nil && time.Since(lastSend) < keepaliveIdle {
			d.cond.Wait()
		}
		switch {
		case d.owner != me:
			d.mu.Unlock()
			return connect.NewError(connect.CodeAborted, fmt.Errorf("attach: another client attached to detached process %q", d.id))
		case d.removed:
			d.mu.Unlock()
			return connect.NewError(connect.CodeNotFound, fmt.Errorf("attach: detached process %q was removed", d.id))
		case ctx.Err() != nil:
			d.mu.Unlock()
			return ctx.Err()
		}
		chunks := d.out.take()
		exit := d.exit
		d.cond.Broadcast()
		d.mu.Unlock()
		for _, c := range chunks {
			o := &sbxv1.ExecOutput{Event: &sbxv1.ExecOutput_Stdout{Stdout: c.data}}
			if c.stderr {
				o = &sbxv1.ExecOutput{Event: &sbxv1.ExecOutput_Stderr{Stderr: c.data}}
			}
			if err := send(o); err != nil {
				// Undelivered output is lost, as with a full buffer.
				return err
			}
			lastSend = time.Now()
		}
		if exit != nil {
			if err := send(&sbxv1.ExecOutput{Event: &sbxv1.ExecOutput_Exited{Exited: exit}}); err != nil {
				return err
			}
			s.collect(d)
			return nil
		}
		if len(chunks) == 0 && time.Since(lastSend) >= keepaliveIdle {
			if err := send(&sbxv1.ExecOutput{Event: &sbxv1.ExecOutput_Keepalive{Keepalive: &sbxv1.ExecKeepalive{}}}); err != nil {
				return err
			}
			lastSend = time.Now()
		}
	}
}

// ListDetached lists the detached processes, background ones included,
// oldest first.
func (s *Server) ListDetached(_ context.Context, _ *connect.Request[agentv1.ListDetachedRequest]) (*connect.Response[agentv1.ListDetachedResponse], error) {
	s.detached.mu.Lock()
	procs := make([]*detachedProc, 0, len(s.detached.procs))
	for _, d := range s.detached.procs {
		procs = append(procs, d)
	}
	s.detached.mu.Unlock()
	slices.SortFunc(procs, func(a, b *detachedProc) int { return a.p.started.Compare(b.p.started) })
	resp := &agentv1.ListDetachedResponse{}
	for _, d := range procs {
		d.mu.Lock()
		dp := &agentv1.DetachedProcess{
			Id: d.id, Pid: int32(d.p.pid), Command: d.argv, StartedMs: d.p.started.UnixMilli(),
			Attached: d.owner != 0, BufferedBytes: uint64(d.out.buffered()),
		}
		if d.exit != nil {
			dp.Exited, dp.ExitCode, dp.Signal = true, d.exit.GetExitCode(), d.exit.GetSignal()
		}
		d.mu.Unlock()
		resp.Processes = append(resp.Processes, dp)
	}
	resp.Processes = append(resp.Processes, s.listBackground()...)
	slices.SortStableFunc(resp.Processes, func(a, b *agentv1.DetachedProcess) int { return cmp.Compare(a.GetStartedMs(), b.GetStartedMs()) })
	return connect.NewResponse(resp), nil
}

// RemoveDetached kills a detached process's group and forgets it.
func (s *Server) RemoveDetached(_ context.Context, req *connect.Request[agentv1.RemoveDetachedRequest]) (*connect.Response[agentv1.RemoveDetachedResponse], error) {
	id := req.Msg.GetId()
	s.detached.mu.Lock()
	d := s.detached.procs[id]
	delete(s.detached.procs, id)
	s.detached.mu.Unlock()
	if d == nil && s.removeBackground(id) {
		return connect.NewResponse(&agentv1.RemoveDetachedResponse{}), nil
	}
	if d == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("remove detached: no detached process %q", id))
	}
	d.mu.Lock()
	d.removed = true
	d.cond.Broadcast()
	d.mu.Unlock()
	d.p.kill()
	s.log.Info("detached process removed", "id", id, "pid", d.p.pid)
	return connect.NewResponse(&agentv1.RemoveDetachedResponse{}), nil
}
