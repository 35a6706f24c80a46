package agent

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// The entrypoint is the sandbox's own command: create's command, else its
// image's ENTRYPOINT/CMD. Its output goes to a logRing (the newest
// maxDetachedOutput bytes of each stream, older bytes dropped and counted),
// never to the agent's own log, which is a file on the host; any number of
// clients read or follow it (Logs) and wait for its exit (Wait), whose
// status is kept for the sandbox's life. Nothing a reader does (or fails to
// do) holds the command back: the ring never blocks it.

// entryProc is a started process whose output goes to a logRing: the
// entrypoint, and the background processes (background_linux.go).
type entryProc struct {
	pumped
	argv []string

	// log is guarded by mu.
	log logRing
}

// newEntryProc returns the entryProc of p, whose output goes to a ring of
// limit bytes a stream in at most chunks pieces (0: no bound on pieces),
// read readSize bytes at a time (0: chunkSize); its pumps are running.
func newEntryProc(s *Server, argv []string, p *process, limit, chunks, readSize int) *entryProc {
	e := &entryProc{argv: slices.Clone(argv), log: logRing{limit: limit, maxChunks: chunks}}
	e.init(p, readSize)
	e.startPumps(s, func(stderr bool, data []byte) { e.log.add(stderr, data, time.Now()) })
	return e
}

// startEntrypoint starts the sandbox's long-running command with the
// current defaults (see startEntrypointLocked).
func (s *Server) startEntrypoint(argv []string) error {
	s.configureMu.Lock()
	defer s.configureMu.Unlock()
	env, dir, userSpec := s.defaults()
	user, err := s.lookupUser("entrypoint", userSpec)
	if err != nil {
		return err
	}
	return s.startEntrypointLocked(argv, env, dir, user)
}

// startEntrypointLocked starts the sandbox's long-running command in the
// background as user (nil: root), replacing an earlier entrypoint that has
// exited; its exit is logged. A command that cannot start (not found, not
// executable, no such workdir) is a *startError.
// s.configureMu must be held.
func (s *Server) startEntrypointLocked(argv, env []string, dir string, user *userInfo) error {
	if old := s.entry.Load(); old != nil && !old.p.exited.Load() {
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("the entrypoint started before is still running"))
	}
	env = userEnv(env, user)
	name := argv[0]
	if !filepath.IsAbs(name) && strings.ContainsRune(name, '/') {
		name = filepath.Join(dir, name)
	}
	path, err := lookPath(name, envLookup(env, "PATH"))
	if err != nil {
		return err
	}
	p, err := s.spawn(path, argv, env, dir, user, &sbxv1.ExecRequest{})
	if err != nil {
		return err
	}
	e := newEntryProc(s, argv, p, s.outputLimit, 0, 0)
	s.entry.Store(e)
	go func() {
		e.watch()
		st := e.wait(context.Background())
		s.log.Info("entrypoint exited", "pid", p.pid, "exit_code", st.GetExitCode(), "signal", st.GetSignal(), "after", time.Since(p.started).Round(time.Millisecond))
	}()
	s.log.Info("entrypoint started", "argv", argv, "pid", p.pid)
	return nil
}

// wait blocks until e has exited and its output is read, or ctx ends (nil).
func (e *entryProc) wait(ctx context.Context) *sbxv1.ExecExited {
	defer context.AfterFunc(ctx, func() {
		e.mu.Lock()
		e.cond.Broadcast()
		e.mu.Unlock()
	})()
	e.mu.Lock()
	defer e.mu.Unlock()
	for e.exit == nil && ctx.Err() == nil {
		e.cond.Wait()
	}
	return e.exit
}

// errNoEntrypoint answers Logs and Wait in a sandbox without a command.
func errNoEntrypoint() error {
	return connect.NewError(connect.CodeFailedPrecondition,
		errors.New("the sandbox has no command (created without one, from an image without ENTRYPOINT or CMD, or with no_entrypoint)"))
}

// Logs streams the entrypoint's output (see sbx.v1 SandboxService.Logs).
func (s *Server) Logs(ctx context.Context, req *connect.Request[sbxv1.LogsRequest], out *connect.ServerStream[sbxv1.LogsEvent]) error {
	e := s.entry.Load()
	if e == nil {
		return errNoEntrypoint()
	}
	return e.logs(ctx, req.Msg, out.Send)
}

// logs sends e's output as req asks (since, tail, follow) to send: a
// dropped event first if the ring lost output, then the pieces, then
// (following) new output with keepalives when idle, and exited last once
// e has exited.
func (e *entryProc) logs(ctx context.Context, req *sbxv1.LogsRequest, send func(*sbxv1.LogsEvent) error) error {
	var since time.Time
	if ms := req.GetSinceUnixMs(); ms > 0 {
		since = time.UnixMilli(ms)
	}
	tail := int64(-1)
	if req.Tail != nil {
		tail = int64(req.GetTail())
	}
	follow := req.GetFollow()
	wake := func() {
		e.mu.Lock()
		e.cond.Broadcast()
		e.mu.Unlock()
	}
	defer context.AfterFunc(ctx, wake)()
	if follow {
		t := time.NewTicker(keepaliveIdle)
		defer t.Stop()
		quit := make(chan struct{})
		defer close(quit)
		go func() {
			for {
				select {
				case <-t.C:
					wake()
				case <-quit:
					return
				}
			}
		}()
	}

	e.mu.Lock()
	cur := e.log.cursor(since, tail)
	before := e.log.dropped()
	e.mu.Unlock()
	if before != [2]uint64{} {
		if err := send(droppedEvent(before)); err != nil {
			return err
		}
	}
	lastSend := time.Now()
	for {
		e.mu.Lock()
		for follow && ctx.Err() == nil && e.exit == nil && !e.log.unread(cur) && time.Since(lastSend) < keepaliveIdle {
			e.cond.Wait()
		}
		chunks, dropped := e.log.read(&cur)
		exit := e.exit
		e.mu.Unlock()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if dropped != [2]uint64{} {
			if err := send(droppedEvent(dropped)); err != nil {
				return err
			}
		}
		for _, c := range chunks {
			ev := &sbxv1.LogsEvent{Event: &sbxv1.LogsEvent_Data{Data: &sbxv1.LogData{Stderr: c.stderr, Data: c.data, TimeUnixMs: c.at.UnixMilli()}}}
			if err := send(ev); err != nil {
				return err
			}
			lastSend = time.Now()
		}
		if exit != nil {
			// The exit is recorded only after all output was read, and this
			// read took everything: nothing comes after it.
			return send(&sbxv1.LogsEvent{Event: &sbxv1.LogsEvent_Exited{Exited: exit}})
		}
		if !follow {
			return nil
		}
		if len(chunks) == 0 && time.Since(lastSend) >= keepaliveIdle {
			if err := send(&sbxv1.LogsEvent{Event: &sbxv1.LogsEvent_Keepalive{Keepalive: &sbxv1.ExecKeepalive{}}}); err != nil {
				return err
			}
			lastSend = time.Now()
		}
	}
}

func droppedEvent(d [2]uint64) *sbxv1.LogsEvent {
	return &sbxv1.LogsEvent{Event: &sbxv1.LogsEvent_Dropped{Dropped: &sbxv1.LogsDropped{StdoutBytes: d[0], StderrBytes: d[1]}}}
}

// Wait returns once the entrypoint has exited (see sbx.v1
// SandboxService.Wait).
func (s *Server) Wait(ctx context.Context, _ *connect.Request[sbxv1.WaitRequest]) (*connect.Response[sbxv1.WaitResponse], error) {
	e := s.entry.Load()
	if e == nil {
		return nil, errNoEntrypoint()
	}
	st := e.wait(ctx)
	if st == nil {
		return nil, ctx.Err()
	}
	return connect.NewResponse(&sbxv1.WaitResponse{Exited: st, Command: e.argv}), nil
}
