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
	return relayExec(ctx, s.streams, start, nil, out.Send, nil)
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
	return relayExec(ctx, s.streams, first.GetStart(), stream.Receive, stream.Send, nil)
}

// dataSink takes a stdout or stderr event as the agent encoded it (a
// FrameOutput payload, execframe.IsData), for a client that speaks the
// framed protocol too; more says that the agent's next frame is already
// here, so the sink may hold its write back for it.
type dataSink func(payload []byte, more bool) error

// relayExec opens an agent exec stream for start in its sandbox (counted
// against the sandbox's running commands), forwards input from recv and
// every output event to send. The Exec RPCs and the exec upgrade
// (execupgrade.go) share it, and one agent transport: the framed exec
// protocol (agentconn.Conn.ExecOnce without recv, ExecInteractive with
// it). With a data sink, the command's stdout and stderr frames go to it
// undecoded, and only the other events (started, keepalive, exited, which
// the daemon marks and observes) are decoded and sent. Output is relayed
// one event at a time, within the sandbox's relay budget (relaybudget.go):
// a send that blocks (a slow client) or waits for the budget stops the
// reading from the agent, whose socket then fills and stops the command's
// output; nothing queues up in between.
func relayExec(ctx context.Context, streams *Streams, start *sbxv1.ExecRequest, recv func() (*sbxv1.ExecInput, error), send func(*sbxv1.ExecOutput) error, data dataSink) error {
	conn, budget, release, err := streams.execRelay(ctx, start.GetSandbox())
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
	var st agentconn.ExecStream
	if recv == nil {
		st, err = conn.ExecOnce(ctx, start)
	} else {
		var ic agentconn.ExecConn
		ic, err = conn.ExecInteractive(ctx, start)
		if err == nil {
			st = ic
			go relayInput(start, recv, ic)
		}
	}
	if err != nil {
		return fmt.Errorf("exec: starting on agent: %w", err)
	}
	start.Stdin = nil // the agent has it: not held for the command's life
	// Closing the stream is what tells the agent that we are gone, so it
	// kills the command when the client disconnects.
	defer st.Close() //nolint:errcheck
	ds, undecoded := st.(agentconn.DataStream)
	for {
		var ok bool
		if undecoded && data != nil {
			var payload []byte
			var more bool
			payload, more, ok = ds.ReceiveData()
			if payload != nil {
				if err := budget.spend(ctx, len(payload)); err != nil {
					return err
				}
				// Held back for the next frame only if that need not
				// wait for the budget.
				if err := data(payload, more && !budget.short(len(payload))); err != nil {
					return err
				}
				continue
			}
		} else {
			ok = st.Receive()
		}
		if !ok {
			break
		}
		msg := st.Msg()
		if err := budget.spend(ctx, len(msg.GetStdout())+len(msg.GetStderr())); err != nil {
			return err
		}
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

// relayInput forwards the client's input events to the agent until the
// client half-closes or goes away: then it closes stdin if the command
// kept it open, and the input side.
func relayInput(start *sbxv1.ExecRequest, recv func() (*sbxv1.ExecInput, error), ic agentconn.ExecConn) {
	for {
		in, err := recv()
		if err != nil {
			if start.GetStdinOpen() {
				_ = ic.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_StdinClose{StdinClose: true}})
			}
			_ = ic.CloseSend()
			return
		}
		if in.GetStart() != nil {
			continue
		}
		if err := ic.Send(in); err != nil {
			return
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
