package agentconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/sbxdev/sbx/api/execframe"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// execFramed starts a command over the agent's framed exec protocol. It is
// errors.ErrUnsupported for an agent that takes framed execs nowhere the
// daemon can reach: no exec socket, and a protocol older than
// protocolFramedOnAPI (asked with Hello if not known yet).
func (c *Conn) execFramed(ctx context.Context, start *sbxv1.ExecRequest) (*framedStream, error) {
	nc, err := c.execConn(ctx)
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
	return &framedStream{ctx: ctx, nc: nc, r: execframe.NewReader(nc), w: w, stop: stop, onClose: c.refill}, nil
}

// execConn returns the spare exec connection, or dials one.
func (c *Conn) execConn(ctx context.Context) (net.Conn, error) {
	c.spareMu.Lock()
	nc := c.spare
	c.spare = nil
	c.spareMu.Unlock()
	if nc != nil {
		return nc, nil
	}
	return c.dialExec(ctx)
}

// dialExec connects to where the agent takes framed execs: its exec
// socket, else (from protocol 5) its API endpoint.
func (c *Conn) dialExec(ctx context.Context) (net.Conn, error) {
	if c.execDial != nil {
		nc, err := c.execDial(ctx)
		if !errors.Is(err, errors.ErrUnsupported) {
			return nc, err
		}
	}
	if c.version.Load() == 0 {
		// Not said yet (the daemon's Hello at create or recovery may
		// still be on its way): ask, once.
		_, _ = c.Hello(ctx)
	}
	if c.version.Load() < protocolFramedOnAPI {
		return nil, fmt.Errorf("agent protocol %d takes framed execs on no endpoint the daemon has: %w", c.version.Load(), errors.ErrUnsupported)
	}
	return c.dial(ctx)
}

// spareDialTimeout bounds the background dial of a spare connection.
const spareDialTimeout = 5 * time.Second

// refill dials a spare exec connection in the background, unless there is
// one, one is being dialled, or the Conn is closed. It runs when a command's
// stream ends, so that the dial never competes with a command starting.
func (c *Conn) refill() {
	c.spareMu.Lock()
	if c.spare != nil || c.refilling || c.closed {
		c.spareMu.Unlock()
		return
	}
	c.refilling = true
	c.spareMu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), spareDialTimeout)
		nc, err := c.dialExec(ctx)
		cancel()
		c.spareMu.Lock()
		defer c.spareMu.Unlock()
		c.refilling = false
		if err != nil {
			return // the next command dials, and says why if it fails
		}
		if c.closed || c.spare != nil {
			nc.Close()
			return
		}
		c.spare = nc
	}()
}

// framedStream is a framed exec: it reads the command's output (the
// methods of connect.ServerStreamForClient that ExecStream names, and
// ReceiveData) and sends its input (ExecConn's).
type framedStream struct {
	ctx  context.Context
	nc   net.Conn
	r    *execframe.Reader
	stop func() bool
	msg  *sbxv1.ExecOutput
	err  error
	done bool
	// onClose runs once, when the stream is closed (Conn.refill).
	onClose func()

	// wmu serialises Send (the start frame is written before the stream
	// is handed out).
	wmu sync.Mutex
	w   *execframe.Writer
}

// Receive reads the next output event; false at the end (after exited) or
// on an error (see Err).
func (s *framedStream) Receive() bool {
	_, _, ok := s.receive(false)
	return ok
}

// ReceiveData is Receive, except that a stdout or stderr event
// (execframe.IsData) is not decoded: data is its frame's payload, valid
// until the next call, and Msg is left alone. more reports that at least
// part of the agent's next frame has already arrived.
func (s *framedStream) ReceiveData() (data []byte, more, ok bool) {
	return s.receive(true)
}

func (s *framedStream) receive(undecoded bool) (data []byte, more, ok bool) {
	if s.done {
		return nil, false, false
	}
	typ, payload, err := s.r.NextShared()
	var m *sbxv1.ExecOutput
	if err == nil {
		if undecoded && typ == execframe.FrameOutput && execframe.IsData(payload) {
			return payload, s.r.Buffered() > 0, true
		}
		m, err = execframe.DecodeOutput(typ, payload)
	}
	if err != nil {
		s.done = true
		var fe *execframe.Error
		switch {
		case errors.As(err, &fe):
			s.err = fe.ConnectError()
		case s.ctx.Err() != nil:
			s.err = ContextError(s.ctx)
		case errors.Is(err, io.EOF):
			s.err = connect.NewError(connect.CodeUnavailable, errors.New("agent closed the exec connection before the command exited"))
		default:
			s.err = connect.NewError(connect.CodeUnavailable, fmt.Errorf("reading exec output from agent: %w", err))
		}
		return nil, false, false
	}
	s.msg = m
	if m.GetExited() != nil {
		s.done = true // the agent closes next
	}
	return nil, false, true
}

// Send sends one input event (stdin, its end, a resize, a signal).
func (s *framedStream) Send(in *sbxv1.ExecInput) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	err := s.w.Write(execframe.FrameInput, in)
	if err == nil {
		err = s.w.Flush()
	}
	if err != nil {
		return fmt.Errorf("sending exec input to agent: %w", err)
	}
	return nil
}

// CloseSend does nothing: the framed protocol never half-closes (the end
// of stdin is a stdin_close event, the connection's end the command's
// cancellation).
func (s *framedStream) CloseSend() error { return nil }

// Msg is the event Receive read.
func (s *framedStream) Msg() *sbxv1.ExecOutput { return s.msg }

// Err is the error that ended the stream, nil after exited.
func (s *framedStream) Err() error { return s.err }

// Close releases the connection; before exited it cancels the command.
func (s *framedStream) Close() error {
	s.stop()
	err := s.nc.Close()
	if s.onClose != nil {
		s.onClose()
		s.onClose = nil
	}
	return err
}

// ContextError is the Connect error for a call whose context ended: its
// deadline (DeadlineExceeded) or its cancellation (Canceled).
func ContextError(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
	}
	return connect.NewError(connect.CodeCanceled, ctx.Err())
}
