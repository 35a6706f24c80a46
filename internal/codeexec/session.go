package codeexec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/crashpoint"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/store"
)

// Sessions keeps stateful shells in sandboxes, the way Service keeps
// kernels: each shell is a detached process of the sandbox's agent (stdin
// open, in a process group of its own, id = session id) that the daemon
// attaches to. Commands are written to the shell's stdin and each is
// followed by an end marker carrying its exit status, on stdout and on
// stderr, so both streams are delimited per command.
//
// With a store (UseStore), sessions survive a daemon restart: their records
// are persisted and Restore re-attaches to their shells. It is safe for
// concurrent use.
type Sessions struct {
	agents Agents
	log    *slog.Logger
	store  ProcessStore // nil: sessions are not persisted
	// stopping is set by Shutdown: streams that end then leave the shells
	// and their records alone.
	stopping atomic.Bool
	// sessions are the live sessions by id.
	sessions *registry[*session]
	limit    Limit // nil: no bound
}

// SetLimit counts every session command against its sandbox's bound on
// running commands (commands queued behind another in one shell count
// too: each holds a client's stream). Call it before serving.
func (s *Sessions) SetLimit(l Limit) { s.limit = l }

// NewSessions returns a Sessions over agents.
func NewSessions(agents Agents, log *slog.Logger) *Sessions {
	if log == nil {
		log = slog.Default()
	}
	s := &Sessions{agents: agents, log: log}
	s.sessions = &registry[*session]{kind: store.ProcessSession, noun: "session", what: "shell session", proc: "shell",
		log: log, agents: agents, restore: s.restoreOne, live: map[string]*session{}}
	return s
}

// UseStore makes s persist its sessions in st. Call it before any Create.
func (s *Sessions) UseStore(st ProcessStore) { s.store = st; s.sessions.useStore(st) }

// SessionSink receives a command's events: output chunks, then the result.
type SessionSink func(*sbxv1.SessionExecEvent) error

// Grace periods after a timeout: SIGINT first, then SIGTERM (the shell
// ignores both, its commands and background jobs do not), then SIGKILL of
// the whole process group, which ends the session.
var (
	sessionTermAfter = 3 * time.Second
	sessionKillAfter = 3 * time.Second
)

type session struct {
	owner              *Sessions
	id, sandbox, shell string
	created            time.Time
	token              []byte
	cancel             context.CancelFunc
	stream             *procStream
	events             chan *sbxv1.ExecOutput
	execs              atomic.Int64
	dead               atomic.Bool
	forgetOnce         sync.Once
	// elsewhere is set once another replica took the process over (or
	// this one let it go for one that did): it is left alone.
	elsewhere atomic.Bool

	// mu serializes commands.
	mu sync.Mutex
	// seq numbers commands. It starts from the clock, so the markers of a
	// command cut off by a daemon restart never match a later command's.
	seq int64
}

// sessionPrelude is sent to a new session's shell before any command. A
// command runs in a shell function, so `declare`/`typeset` without -g make
// variables local to that command; `export` and plain assignments persist.
const sessionPrelude = "trap '[ -n \"$__sbx_in\" ] && return 130' INT TERM\n" +
	"__sbx_run() { __sbx_in=1; eval \"$__sbx_cmd\"; }\n"

// shellArgv is the command line that starts shell non-interactively.
func shellArgv(shell string) []string {
	switch path.Base(shell) {
	case "bash":
		return []string{shell, "--noprofile", "--norc"}
	case "zsh":
		return []string{shell, "-f"}
	}
	return []string{shell}
}

// Create starts a shell in req.Sandbox.
func (s *Sessions) Create(ctx context.Context, req *sbxv1.CreateSessionRequest) (*sbxv1.Session, error) {
	shell := req.GetShell()
	if shell == "" {
		shell = "/bin/bash"
	}
	if strings.ContainsAny(shell, " \t\n") {
		return nil, fmt.Errorf("create session: shell must be a program path, not %q: %w", shell, errdefs.ErrInvalidArgument)
	}
	sbID, err := s.agents.ResolveID(ctx, req.GetSandbox())
	if err != nil {
		return nil, err
	}
	conn, release, err := s.agents.Agent(ctx, sbID)
	if err != nil {
		return nil, err
	}
	defer release()
	ss := &session{
		owner: s, id: sessionPrefix + newID(), sandbox: sbID, shell: shell, created: time.Now(),
		token: []byte("\x1eSBX" + newID() + ":"), events: make(chan *sbxv1.ExecOutput, 256),
		seq: time.Now().UnixMicro(),
	}
	// The shell outlives this request: its stream hangs off a context of its own.
	sctx, cancel := context.WithCancel(context.Background())
	ss.cancel = cancel
	start := &sbxv1.ExecRequest{Argv: shellArgv(shell), Env: req.GetEnv(), Workdir: req.GetWorkdir(), StdinOpen: true}
	if ss.stream, err = attach(ctx, sctx, cancel, conn, ss.id, start); err != nil {
		if errors.Is(err, errdefs.ErrFailedPrecondition) {
			return nil, fmt.Errorf("create session: shell %s failed to start: %w", shell, err)
		}
		return nil, fmt.Errorf("create session: starting shell: %w", err)
	}
	go ss.read(s)
	// The shell survives SIGINT and SIGTERM (sent to its process group on a
	// timeout); the commands it runs get the default dispositions back. Each
	// command runs inside __sbx_run, so the trap's `return` abandons the rest
	// of a compound command ("sleep 9; echo after") instead of going on with
	// it. Outside __sbx_run the trap does nothing (a top-level return would
	// end dash).
	if err := ss.send(sessionPrelude); err != nil {
		ss.close()
		return nil, err
	}
	// A first, empty command proves the shell is up.
	res := &sbxv1.SessionExecResult{}
	if err := ss.exec(ctx, &sbxv1.SessionExecRequest{Command: ":", TimeoutMs: 30000}, res, func(*sbxv1.SessionExecEvent) error { return nil }); err != nil || res.Error != "" || res.ExitCode != 0 {
		ss.close()
		if err == nil {
			err = fmt.Errorf("create session: shell %s failed to start: %s: %w", shell, res.Error, errdefs.ErrFailedPrecondition)
		}
		return nil, err
	}
	ss.execs.Store(0)
	crashpoint.Hit("session-started")
	// Registered before its record exists, so that a record without a live
	// session is always one to restore.
	s.sessions.put(ss)
	if s.store != nil {
		rec := &store.ProcessRecord{ID: ss.id, Kind: store.ProcessSession, SandboxID: ss.sandbox, Program: shell,
			Token: ss.token, Workdir: req.GetWorkdir(), CreatedAtMs: ss.created.UnixMilli(), Lease: s.sessions.newLease()}
		if err := s.store.PutProcess(ctx, rec); err != nil {
			s.sessions.drop(ss)
			ss.close()
			return nil, fmt.Errorf("create session: %w", err)
		}
	}
	crashpoint.Hit("session-recorded")
	s.log.Info("shell session created", "session", ss.id, "sandbox", ss.sandbox, "shell", shell)
	return ss.info(), nil
}

// Restore re-attaches to the shells of the persisted sessions (after the
// sandboxes were recovered). A session whose shell is gone (its sandbox was
// destroyed, the shell exited) is dropped with a log line; one whose
// sandbox is not running now (stopped) keeps its record and is re-attached
// when it is next used. The result of a command that was running when the
// daemon stopped is lost.
func (s *Sessions) Restore(ctx context.Context) error {
	return s.sessions.restoreAll(ctx)
}

// restoreOne re-attaches r's shell and registers it.
func (s *Sessions) restoreOne(ctx context.Context, r *store.ProcessRecord) error {
	conn, release, err := s.agents.Agent(ctx, r.SandboxID)
	if err != nil {
		return err
	}
	defer release()
	ss := &session{
		owner: s, id: r.ID, sandbox: r.SandboxID, shell: r.Program, created: time.UnixMilli(r.CreatedAtMs),
		token: r.Token, events: make(chan *sbxv1.ExecOutput, 256), seq: time.Now().UnixMicro(),
	}
	if err := checkDetached(ctx, conn, r.ID); err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(context.Background())
	ss.cancel = cancel
	if ss.stream, err = attach(ctx, sctx, cancel, conn, ss.id, nil); err != nil {
		return err
	}
	s.sessions.put(ss)
	go ss.read(s)
	s.log.Info("shell session re-attached", "session", r.ID, "sandbox", r.SandboxID)
	return nil
}

// Shutdown detaches from every shell without stopping it and without
// forgetting its record, for a daemon that is stopping.
func (s *Sessions) Shutdown() {
	s.stopping.Store(true)
	for _, ss := range s.sessions.all() {
		ss.cancel()
	}
}

func (ss *session) ident() (id, sandbox string) { return ss.id, ss.sandbox }

func (ss *session) info() *sbxv1.Session {
	return &sbxv1.Session{Id: ss.id, Sandbox: ss.sandbox, Shell: ss.shell, CreatedMs: ss.created.UnixMilli(), Execs: ss.execs.Load()}
}

func (ss *session) send(text string) error {
	if err := ss.stream.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Stdin{Stdin: []byte(text)}}); err != nil {
		ss.close()
		return fmt.Errorf("session %s: sending command: %w", ss.id, errdefs.ErrUnavailable)
	}
	return nil
}

func (ss *session) signal(sig int32) {
	_ = ss.stream.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Signal{Signal: sig}})
}

// read moves the stream's events to ss.events until it ends, then forgets
// ss (and, unless the daemon is stopping, its shell and record).
func (ss *session) read(s *Sessions) {
	defer func() {
		ss.dead.Store(true)
		close(ss.events)
		if !s.stopping.Load() {
			ss.forget()
		}
		s.sessions.drop(ss)
		ss.cancel()
		ss.stream.close()
	}()
	for {
		msg, err := ss.stream.Receive()
		if err != nil {
			if connect.CodeOf(err) == connect.CodeAborted {
				// Another client attached: the agent gave it the process.
				ss.elsewhere.Store(true)
			}
			return
		}
		ss.events <- msg
		if msg.GetExited() != nil {
			return
		}
	}
}

// detach drops the stream and leaves the shell and its record alone.
func (ss *session) detach() {
	ss.elsewhere.Store(true)
	ss.cancel()
}

// close kills the shell's whole process group (background jobs included),
// drops the stream and forgets the session.
func (ss *session) close() {
	if !ss.dead.Swap(true) && !ss.elsewhere.Load() {
		ss.signal(9)
	}
	ss.cancel()
	ss.forget()
}

// forget removes the session's record and its detached process, once.
func (ss *session) forget() {
	if ss.elsewhere.Load() {
		return // another replica's now
	}
	ss.forgetOnce.Do(func() {
		forgetProcess(ss.owner.agents, ss.owner.store, ss.owner.log, ss.sandbox, ss.id)
	})
}

// List lists live sessions, of one sandbox if sandbox is set.
func (s *Sessions) List(ctx context.Context, sandbox string) []*sbxv1.Session {
	var out []*sbxv1.Session
	live, others := s.sessions.list(ctx, sandbox)
	for _, ss := range live {
		out = append(out, ss.info())
	}
	for _, r := range others {
		out = append(out, &sbxv1.Session{Id: r.ID, Sandbox: r.SandboxID, Shell: r.Program, CreatedMs: r.CreatedAtMs})
	}
	return out
}

// Close kills a session's shell and everything it started.
func (s *Sessions) Close(ctx context.Context, id string) error { return s.sessions.close(ctx, id) }

// Exec runs req.Command in its session, sending output and then the result to sink.
func (s *Sessions) Exec(ctx context.Context, req *sbxv1.SessionExecRequest, sink SessionSink) error {
	if req.GetTimeoutMs() < 0 {
		return fmt.Errorf("session exec: negative timeout: %w", errdefs.ErrInvalidArgument)
	}
	if strings.ContainsRune(req.GetCommand(), 0) {
		return fmt.Errorf("session exec: command contains a NUL byte: %w", errdefs.ErrInvalidArgument)
	}
	// With a shared store this holds the session's lease for the command.
	return s.sessions.use(ctx, req.GetSession(), func(ss *session) error { return s.exec(ctx, ss, req, sink) })
}

// exec is Exec in the live session ss.
func (s *Sessions) exec(ctx context.Context, ss *session, req *sbxv1.SessionExecRequest, sink SessionSink) error {
	if s.limit != nil {
		spend, done, err := s.limit(ctx, ss.sandbox)
		if err != nil {
			return err
		}
		defer done()
		sink = budgetedSession(ctx, sink, spend)
	}
	start := time.Now()
	res := &sbxv1.SessionExecResult{}
	if err := ss.exec(ctx, req, res, sink); err != nil {
		return err
	}
	res.DurationMs = time.Since(start).Milliseconds()
	return sink(&sbxv1.SessionExecEvent{Event: &sbxv1.SessionExecEvent_Result{Result: res}})
}

// budgetedSession returns sink with every output event charged to spend
// first (budgeted's twin for session commands).
func budgetedSession(ctx context.Context, sink SessionSink, spend Spend) SessionSink {
	return charged(ctx, sink, spend, func(ev *sbxv1.SessionExecEvent) (int, bool) {
		switch e := ev.GetEvent().(type) {
		case *sbxv1.SessionExecEvent_Stdout:
			return len(e.Stdout), true
		case *sbxv1.SessionExecEvent_Stderr:
			return len(e.Stderr), true
		}
		return 0, false
	})
}

func sessionChunk(sink SessionSink, b []byte, stderr bool) error {
	if len(b) == 0 {
		return nil
	}
	ev := &sbxv1.SessionExecEvent{Event: &sbxv1.SessionExecEvent_Stdout{Stdout: b}}
	if stderr {
		ev = &sbxv1.SessionExecEvent{Event: &sbxv1.SessionExecEvent_Stderr{Stderr: b}}
	}
	return sink(ev)
}

// exec writes one command, wrapped with its end markers, and demultiplexes
// its output until both markers have come.
func (ss *session) exec(ctx context.Context, req *sbxv1.SessionExecRequest, res *sbxv1.SessionExecResult, sink SessionSink) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.dead.Load() {
		return fmt.Errorf("session %s has ended: %w", ss.id, errdefs.ErrFailedPrecondition)
	}
	ss.execs.Add(1)
	// Drop output left over from earlier commands (background jobs, a command the client abandoned).
	for drained := false; !drained; {
		select {
		case _, ok := <-ss.events:
			drained = !ok
		default:
			drained = true
		}
	}
	ss.seq++
	seq := strconv.FormatInt(ss.seq, 10)
	// The command runs through eval in the shell itself (so cd, export,
	// source and background jobs persist), with stdin from /dev/null (so it
	// cannot read the commands that follow); a syntax error in it cannot
	// swallow the marker lines.
	marker := shQuote(string(ss.token) + seq + ":%d\n")
	script := "__sbx_cmd=" + shQuote(req.GetCommand()) + "\n" +
		"__sbx_run </dev/null; __sbx_rc=$?; __sbx_in=\n" +
		"printf " + marker + " \"$__sbx_rc\"; printf " + marker + " \"$__sbx_rc\" >&2\n"
	if err := ss.send(script); err != nil {
		return err
	}
	var timeout, term, kill <-chan time.Time
	if req.GetTimeoutMs() > 0 {
		t := time.NewTimer(time.Duration(req.GetTimeoutMs()) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	stdout, stderr := &splitter{token: ss.token}, &splitter{token: ss.token}
	outDone, errDone := false, false
	// mine reports whether a marker payload ("seq:status") ends this command.
	mine := func(m string) bool {
		n, status, ok := strings.Cut(m, ":")
		if !ok || n != seq {
			return false
		}
		code, _ := strconv.Atoi(status)
		res.ExitCode = int32(code)
		return true
	}
	for !outDone || !errDone {
		select {
		case msg, ok := <-ss.events:
			if !ok && ss.elsewhere.Load() {
				return fmt.Errorf("session %s: another replica took its shell over: %w", ss.id, errdefs.ErrUnavailable)
			}
			if !ok || msg.GetExited() != nil {
				ss.close()
				res.ExitCode, res.Error = 1, "the session's shell exited; the session is gone"
				if ex := msg.GetExited(); ex != nil {
					res.ExitCode = ex.GetExitCode()
					res.Error = fmt.Sprintf("the session's shell exited (exit code %d); the session is gone", ex.GetExitCode())
				}
				return nil
			}
			switch ev := msg.GetEvent().(type) {
			case *sbxv1.ExecOutput_Stdout:
				user, msgs := stdout.feed(ev.Stdout)
				if err := sessionChunk(sink, user, false); err != nil {
					return err
				}
				for _, m := range msgs {
					outDone = mine(m) || outDone
				}
			case *sbxv1.ExecOutput_Stderr:
				user, msgs := stderr.feed(ev.Stderr)
				if err := sessionChunk(sink, user, true); err != nil {
					return err
				}
				for _, m := range msgs {
					errDone = mine(m) || errDone
				}
			}
		case <-timeout:
			res.TimedOut = true
			ss.signal(2)
			term = time.After(sessionTermAfter)
		case <-term:
			ss.signal(15)
			kill = time.After(sessionKillAfter)
		case <-kill:
			ss.close()
			res.ExitCode, res.Error = 137, "timed out; the command did not stop when interrupted or terminated, so the session was closed"
			return nil
		case <-ctx.Done():
			ss.signal(2)
			return ctx.Err()
		}
	}
	return nil
}
