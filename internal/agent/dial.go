package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"connectrpc.com/connect"
	agentv1 "github.com/sbxdev/sbx/api/gen/agent/v1"
)

// dialChunk is the largest data message Dial sends.
const dialChunk = 32 << 10

// dialTimeout bounds connecting to the target.
const dialTimeout = 10 * time.Second

// Dial connects to host:port from inside the sandbox (the agent is PID 1 in
// its network namespace, so 127.0.0.1 is the sandbox's own loopback) and
// relays bytes both ways.
//
// The protocol: the daemon's first message is a start; the agent answers
// connected once the TCP connection is up (a failed dial ends the call with
// Unavailable). Then data flows both ways. The daemon's close_write (or the
// end of its request stream) half-closes the connection's write side. When
// the target closes its write side the agent sends one data message with
// empty data (the EOF mark) and keeps relaying the daemon's bytes until the
// daemon half-closes too; then the call ends. A reset of the call by the
// daemon closes the connection at once.
func (s *Server) Dial(ctx context.Context, stream *connect.BidiStream[agentv1.DialInput, agentv1.DialOutput]) error {
	first, err := stream.Receive()
	if err != nil {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("dial: reading the start message: %w", err))
	}
	start := first.GetStart()
	if start == nil {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("dial: the first message must be a start"))
	}
	host, port := start.GetHost(), start.GetPort()
	if host == "" {
		host = "127.0.0.1"
	}
	if port == 0 || port > 65535 {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("dial: port %d is not in 1-65535", port))
	}
	addr := net.JoinHostPort(host, strconv.FormatUint(uint64(port), 10))
	d := net.Dialer{Timeout: dialTimeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("dial %s in the sandbox: %w", addr, unwrapOpError(err)))
	}
	defer c.Close()
	// A reset by the daemon cancels ctx: unblock both directions.
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()

	if err := stream.Send(&agentv1.DialOutput{Event: &agentv1.DialOutput_Connected{Connected: &agentv1.DialConnected{}}}); err != nil {
		return err
	}

	// Daemon → target.
	inDone := make(chan error, 1)
	go func() {
		inDone <- relayIn(stream, c)
	}()

	// Target → daemon.
	buf := make([]byte, dialChunk)
	for {
		n, rerr := c.Read(buf)
		if n > 0 {
			if err := stream.Send(&agentv1.DialOutput{Event: &agentv1.DialOutput_Data{Data: buf[:n]}}); err != nil {
				c.Close()
				<-inDone
				return err
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// The target reset the connection: end the call (the
			// daemon's side sees the end of the stream).
			return connect.NewError(connect.CodeAborted, fmt.Errorf("dial %s: %w", addr, unwrapOpError(rerr)))
		}
	}
	// The EOF mark: an empty data message.
	if err := stream.Send(&agentv1.DialOutput{Event: &agentv1.DialOutput_Data{Data: []byte{}}}); err != nil {
		c.Close()
		<-inDone
		return err
	}
	// Wait for the daemon to finish sending (or reset the call).
	if err := <-inDone; err != nil {
		return err
	}
	return nil
}

// relayIn copies the daemon's data messages to c until the daemon
// half-closes (then c's write side is shut) or the call fails (then c is
// closed, which also ends the other direction).
func relayIn(stream *connect.BidiStream[agentv1.DialInput, agentv1.DialOutput], c net.Conn) error {
	for {
		msg, err := stream.Receive()
		if errors.Is(err, io.EOF) {
			closeWrite(c)
			return nil
		}
		if err != nil {
			c.Close()
			return err
		}
		switch ev := msg.GetEvent().(type) {
		case *agentv1.DialInput_Data:
			if _, err := c.Write(ev.Data); err != nil {
				c.Close()
				return connect.NewError(connect.CodeAborted, fmt.Errorf("dial: writing to the target: %w", unwrapOpError(err)))
			}
		case *agentv1.DialInput_CloseWrite:
			if ev.CloseWrite {
				closeWrite(c)
				// Drain until the daemon ends its stream; more data
				// after a close_write is a protocol error.
				for {
					if _, err := stream.Receive(); err != nil {
						if errors.Is(err, io.EOF) {
							return nil
						}
						c.Close()
						return err
					}
				}
			}
		case *agentv1.DialInput_Start:
			c.Close()
			return connect.NewError(connect.CodeInvalidArgument, errors.New("dial: a second start message"))
		}
	}
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// unwrapOpError drops net.OpError's address noise ("dial tcp 127.0.0.1:80:
// connect: connection refused" → "connection refused").
func unwrapOpError(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err
	}
	return err
}
