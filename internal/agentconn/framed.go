package agentconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/execframe"
)

// execFramed starts a command over the agent's framed exec protocol.
func (c *Conn) execFramed(ctx context.Context, start *sbxv1.ExecRequest) (*framedStream, error) {
	nc, err := c.execDial(ctx)
	if err != nil {
		switch {
		case errors.Is(err, errors.ErrUnsupported):
			return nil, err
		case ctx.Err() != nil:
			return nil, ContextError(ctx)
		}
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("agent exec socket: %w", err))
	}
	w := execframe.NewWriter(nc)
	err = w.Write(execframe.FrameInput, &sbxv1.ExecInput{Event: &sbxv1.ExecInput_Start{Start: start}})
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		nc.Close()
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("sending exec start to agent: %w", err))
	}
	// Closing the connection is what cancels the command in the agent.
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	return &framedStream{ctx: ctx, nc: nc, r: execframe.NewReader(nc), stop: stop}, nil
}

// framedStream reads a framed exec's output; it has the methods of
// connect.ServerStreamForClient that ExecStream names.
type framedStream struct {
	ctx  context.Context
	nc   net.Conn
	r    *execframe.Reader
	stop func() bool
	msg  *sbxv1.ExecOutput
	err  error
	done bool
}

// Receive reads the next output event; false at the end (after exited) or
// on an error (see Err).
func (s *framedStream) Receive() bool {
	if s.done {
		return false
	}
	m, err := s.r.ReadOutput()
	if err != nil {
		s.done = true
		var fe *execframe.Error
		switch {
		case errors.As(err, &fe):
			s.err = connect.NewError(connect.Code(fe.Code), errors.New(fe.Message))
		case s.ctx.Err() != nil:
			s.err = ContextError(s.ctx)
		case errors.Is(err, io.EOF):
			s.err = connect.NewError(connect.CodeUnavailable, errors.New("agent closed the exec connection before the command exited"))
		default:
			s.err = connect.NewError(connect.CodeUnavailable, fmt.Errorf("reading exec output from agent: %w", err))
		}
		return false
	}
	s.msg = m
	if m.GetExited() != nil {
		s.done = true // the agent closes next
	}
	return true
}

// Msg is the event Receive read.
func (s *framedStream) Msg() *sbxv1.ExecOutput { return s.msg }

// Err is the error that ended the stream, nil after exited.
func (s *framedStream) Err() error { return s.err }

// Close releases the connection; before exited it cancels the command.
func (s *framedStream) Close() error {
	s.stop()
	return s.nc.Close()
}

// ContextError is the Connect error for a call whose context ended: its
// deadline (DeadlineExceeded) or its cancellation (Canceled).
func ContextError(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
	}
	return connect.NewError(connect.CodeCanceled, ctx.Err())
}
