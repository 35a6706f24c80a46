package server

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/agentconn"
	"github.com/sbxdev/sbx/internal/sandbox"
)

func validateExec(req *sbxv1.ExecRequest) error {
	if req == nil {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("exec: the first message must be `start`"))
	}
	if (len(req.GetArgv()) == 0) == (req.GetShell() == "") {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("exec: give exactly one of argv and shell"))
	}
	if req.GetTimeoutMs() < 0 {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("exec: timeout %dms must not be negative", req.GetTimeoutMs()))
	}
	args := req.GetArgv()
	if sh := req.GetShell(); sh != "" {
		args = []string{sh}
	}
	if err := sandbox.CheckArgsEnv("exec", args, req.GetEnv()); err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	return nil
}

// Exec runs a command with stdin given up front and streams its output.
func (s *Server) Exec(ctx context.Context, req *connect.Request[sbxv1.ExecRequest], out *connect.ServerStream[sbxv1.ExecOutput]) error {
	start := req.Msg
	if err := validateExec(start); err != nil {
		return err
	}
	start.StdinOpen = false
	return relayExec(ctx, s.streams, start, nil, out.Send)
}

// ExecInteractive relays stdin, resizes and signals to a running command.
func (s *Server) ExecInteractive(ctx context.Context, stream *connect.BidiStream[sbxv1.ExecInput, sbxv1.ExecOutput]) error {
	first, err := stream.Receive()
	if err != nil {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("exec: reading the start message: %w", err))
	}
	if err := validateExec(first.GetStart()); err != nil {
		return err
	}
	return relayExec(ctx, s.streams, first.GetStart(), stream.Receive, stream.Send)
}

// relayExec opens an agent exec stream for start in its sandbox (counted
// against the sandbox's running commands), forwards input from recv and
// every output event to send. Without recv (no input after start) it takes
// the cheaper execOnce path. The Exec RPCs and the exec upgrade
// (execupgrade.go) share it. Output is relayed one event at a time: a send
// that blocks (a slow client) stops the reading from the agent, whose
// flow control then stops the command's output; nothing queues up in
// between.
func relayExec(ctx context.Context, streams *Streams, start *sbxv1.ExecRequest, recv func() (*sbxv1.ExecInput, error), send func(*sbxv1.ExecOutput) error) error {
	conn, release, err := streams.exec(ctx, start.GetSandbox())
	if err != nil {
		return err
	}
	defer release()
	send = markOOM(ctx, streams.mgr, start.GetSandbox(), send)
	var exited *sbxv1.ExecExited
	ended := observerFrom(ctx).execStarted(ctx, start)
	defer func() { ended(exited) }()
	sendOut := send
	send = func(m *sbxv1.ExecOutput) error {
		if ex := m.GetExited(); ex != nil {
			exited = ex
		}
		return sendOut(m)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if recv == nil {
		return execOnce(ctx, conn, start, send)
	}
	as := conn.Exec(ctx)
	// Closing the response is what tells the agent (over HTTP/2) that we are
	// gone, so it kills the command when the client disconnects.
	defer as.CloseResponse() //nolint:errcheck
	if err := as.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Start{Start: start}}); err != nil && !errors.Is(err, errEOF) {
		return fmt.Errorf("exec: sending start to agent: %w", err)
	}
	start.Stdin = nil // sent: not held for the command's life
	go func() {
		for {
			in, err := recv()
			if err != nil {
				// Client went away or half-closed: close stdin if it was open,
				// and our side of the agent stream. Until that side is closed
				// the HTTP/2 transport is busy sending its body and does not
				// watch ctx, so a client gone for good left the command
				// running until the agent's next keepalive failed (10 s).
				if start.GetStdinOpen() {
					_ = as.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_StdinClose{StdinClose: true}})
				}
				_ = as.CloseRequest()
				return
			}
			if in.GetStart() != nil {
				continue
			}
			if err := as.Send(in); err != nil {
				return
			}
		}
	}()
	for {
		msg, err := as.Receive()
		if err != nil {
			if errors.Is(err, errEOF) {
				return nil
			}
			if ctx.Err() != nil {
				return agentconn.ContextError(ctx)
			}
			return err
		}
		if err := send(msg); err != nil {
			return err
		}
		if msg.GetExited() != nil {
			return nil
		}
	}
}

// markOOM reads the sandbox's limit counters now, before the command
// starts, and wraps send so that its exited event says whether the
// sandbox's memory limit killed it (oom_killed) and whether its pids limit
// refused a fork meanwhile (pids_limit_hit); see sandbox.LimitWatch.
func markOOM(ctx context.Context, mgr *sandbox.Manager, sandbox string, send func(*sbxv1.ExecOutput) error) func(*sbxv1.ExecOutput) error {
	w := mgr.WatchLimits(ctx, sandbox)
	return func(m *sbxv1.ExecOutput) error {
		if ex := m.GetExited(); ex != nil {
			w.Mark(ctx, ex)
		}
		return send(m)
	}
}

// execOnce relays a command that takes no input after start: the agent's
// Exec called as a server stream (see agentconn.Conn.ExecOnce), the cheaper
// path for the common `Exec` RPC.
func execOnce(ctx context.Context, conn *agentconn.Conn, start *sbxv1.ExecRequest, send func(*sbxv1.ExecOutput) error) error {
	st, err := conn.ExecOnce(ctx, start)
	if err != nil {
		return fmt.Errorf("exec: starting on agent: %w", err)
	}
	start.Stdin = nil // the agent has it: not held for the command's life
	// Closing the response is what tells the agent (over HTTP/2) that we are
	// gone, so it kills the command when the client disconnects.
	defer st.Close() //nolint:errcheck
	for st.Receive() {
		msg := st.Msg()
		if err := send(msg); err != nil {
			return err
		}
		if msg.GetExited() != nil {
			return nil
		}
	}
	if err := st.Err(); err != nil {
		if ctx.Err() != nil {
			return agentconn.ContextError(ctx)
		}
		return err
	}
	return nil
}
