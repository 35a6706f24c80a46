package sbx

import (
	"bytes"
	"context"
	"io"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// Session is a stateful shell in a sandbox: the working directory, exported
// variables, activated virtualenvs and background jobs survive between Exec
// calls.
type Session struct {
	c       *Client
	ID      string
	Sandbox string
	Shell   string
	// Info is the session as the daemon listed or created it (nil for a
	// handle made by Client.Session).
	Info *sbxv1.Session
}

// SessionOptions tune CreateSession.
type SessionOptions struct {
	// Shell is the shell program (default: /bin/bash).
	Shell   string
	Env     map[string]string
	Workdir string
}

// SessionExecOptions tune one Session.Exec.
type SessionExecOptions struct {
	// Timeout interrupts the command (SIGINT); the session survives.
	Timeout time.Duration
	// Stdout and Stderr receive output as it arrives (it is collected in the result too).
	Stdout, Stderr io.Writer
}

// SessionResult is a finished command.
type SessionResult struct {
	Stdout, Stderr []byte
	ExitCode       int
	TimedOut       bool
	Duration       time.Duration
	// Error is set when the session ended during the command.
	Error string
}

// CreateSession starts a shell session in the sandbox.
func (s *Sandbox) CreateSession(ctx context.Context, opts SessionOptions) (*Session, error) {
	resp, err := s.c.session.CreateSession(ctx, connect.NewRequest(&sbxv1.CreateSessionRequest{
		Sandbox: s.ID, Shell: opts.Shell, Env: opts.Env, Workdir: opts.Workdir,
	}))
	if err != nil {
		return nil, wrap("create session", err)
	}
	return s.c.shellSession(resp.Msg.GetSession()), nil
}

func (c *Client) shellSession(ss *sbxv1.Session) *Session {
	return &Session{c: c, ID: ss.GetId(), Sandbox: ss.GetSandbox(), Shell: ss.GetShell(), Info: ss}
}

// Sessions lists the sandbox's live sessions.
func (s *Sandbox) Sessions(ctx context.Context) ([]*Session, error) { return s.c.Sessions(ctx, s.ID) }

// Sessions lists live sessions (of one sandbox if sandbox is not empty).
func (c *Client) Sessions(ctx context.Context, sandbox string) ([]*Session, error) {
	resp, err := c.session.ListSessions(ctx, connect.NewRequest(&sbxv1.ListSessionsRequest{Sandbox: sandbox}))
	if err != nil {
		return nil, wrap("list sessions", err)
	}
	var out []*Session
	for _, ss := range resp.Msg.GetSessions() {
		out = append(out, c.shellSession(ss))
	}
	return out, nil
}

// Session returns a handle on an existing session by id.
func (c *Client) Session(id string) *Session { return &Session{c: c, ID: id} }

// Exec runs command in the session's shell. A failing command is not an error.
func (ss *Session) Exec(ctx context.Context, command string, opts SessionExecOptions) (*SessionResult, error) {
	st, err := ss.c.session.SessionExec(ctx, connect.NewRequest(&sbxv1.SessionExecRequest{
		Session: ss.ID, Command: command, TimeoutMs: opts.Timeout.Milliseconds(),
	}))
	if err != nil {
		return nil, wrap("session exec", err)
	}
	defer st.Close()
	var stdout, stderr bytes.Buffer
	res := &SessionResult{}
	for st.Receive() {
		switch ev := st.Msg().GetEvent().(type) {
		case *sbxv1.SessionExecEvent_Stdout:
			stdout.Write(ev.Stdout)
			if opts.Stdout != nil {
				_, _ = opts.Stdout.Write(ev.Stdout)
			}
		case *sbxv1.SessionExecEvent_Stderr:
			stderr.Write(ev.Stderr)
			if opts.Stderr != nil {
				_, _ = opts.Stderr.Write(ev.Stderr)
			}
		case *sbxv1.SessionExecEvent_Result:
			r := ev.Result
			res.ExitCode, res.TimedOut, res.Error = int(r.GetExitCode()), r.GetTimedOut(), r.GetError()
			res.Duration = time.Duration(r.GetDurationMs()) * time.Millisecond
		}
	}
	if err := st.Err(); err != nil {
		return nil, wrap("session exec", err)
	}
	res.Stdout, res.Stderr = stdout.Bytes(), stderr.Bytes()
	return res, nil
}

// Close kills the session's shell and everything it started.
func (ss *Session) Close(ctx context.Context) error {
	_, err := ss.c.session.CloseSession(ctx, connect.NewRequest(&sbxv1.CloseSessionRequest{Session: ss.ID}))
	return wrap("close session", err)
}
