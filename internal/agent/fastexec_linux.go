package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"

	"connectrpc.com/connect"

	"github.com/sbxdev/sbx/api/execframe"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// ServeExec serves the framed exec protocol (api/execframe) on ln until
// ctx ends: one command per connection, the same messages as Exec.
func (s *Server) ServeExec(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveExecConn(ctx, c)
		}()
	}
}

// serveExecConn runs the one command of an exec connection.
func (s *Server) serveExecConn(ctx context.Context, c net.Conn) {
	defer c.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The daemon never half-closes: the connection ending is the command's
	// cancellation, as a reset stream is for Exec.
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	fs := &frameStream{r: execframe.NewReader(c), w: execframe.NewWriter(c), cancel: cancel}
	first, err := fs.r.ReadInput()
	if err != nil {
		return
	}
	var runErr error
	if req := first.GetStart(); req == nil {
		runErr = connect.NewError(connect.CodeInvalidArgument, errors.New("first exec message must be start"))
	} else {
		runErr = s.runExec(context.WithValue(ctx, batchWriterKey{}, flushHolder(fs)), fs, req)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if runErr != nil && ctx.Err() == nil {
		_ = fs.w.WriteErrorOf(runErr, connect.CodeInternal)
	}
	_ = fs.w.Flush()
}

// frameStream is an exec connection as an execStream.
type frameStream struct {
	r      *execframe.Reader
	cancel context.CancelFunc
	mu     sync.Mutex // guards w and hold: Send and the final flush
	w      *execframe.Writer
	hold   bool
}

func (fs *frameStream) setHold(h bool) {
	fs.mu.Lock()
	fs.hold = h
	fs.mu.Unlock()
}

// Receive returns the next input message. The connection's end (or any
// read error) cancels the command.
func (fs *frameStream) Receive() (*sbxv1.ExecInput, error) {
	in, err := fs.r.ReadInput()
	if err != nil {
		fs.cancel()
		if errors.Is(err, io.EOF) {
			// Not the end of stdin (the daemon never half-closes): gone.
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return in, nil
}

// Send writes m, and sends it unless flushes are held.
func (fs *frameStream) Send(m *sbxv1.ExecOutput) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if err := fs.w.Write(execframe.FrameOutput, m); err != nil {
		return err
	}
	if fs.hold {
		return nil
	}
	return fs.w.Flush()
}
