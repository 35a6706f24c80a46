package agentconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/sbxdev/sbx/api/execframe"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/splice"
)

// Raw file connections (protocol 6; the protocol is described in
// api/execframe's rawfile.go): a file's bytes go to and from the agent as a
// plain stream on a connection of their own, spliced, instead of in
// WriteFile/ReadFile messages over HTTP/2.

// RawPipeBytes is the pipe the daemon splices file data through.
const RawPipeBytes = 1 << 20

// rawFiles reports whether the agent takes raw file connections, asking it
// (Hello) if its protocol is not known yet.
func (c *Conn) rawFiles(ctx context.Context) bool {
	if c.version.Load() == 0 {
		_, _ = c.Hello(ctx)
	}
	return c.version.Load() >= protocolRawFiles
}

// dialRaw connects for one raw transfer, closed when ctx ends.
func (c *Conn) dialRaw(ctx context.Context) (net.Conn, func() bool, error) {
	nc, err := c.dial(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, ContextError(ctx)
		}
		return nil, nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("connecting to the agent: %w", err))
	}
	return nc, context.AfterFunc(ctx, func() { nc.Close() }), nil
}

// readReply reads the agent's frame after a request or the data: want, or
// a FrameError as the Connect error it carries.
func readReply(ctx context.Context, nc net.Conn, want byte) ([]byte, error) {
	typ, payload, err := execframe.ReadFrameUnbuffered(nc, execframe.MaxFileHeader)
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, ContextError(ctx)
	case err != nil:
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("the agent ended the file transfer without an answer (the sandbox stopped or was destroyed?): %w", err))
	case typ == execframe.FrameError:
		return nil, execframe.ParseError(payload).ConnectError()
	case typ != want:
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("agent answered a file transfer with frame %q, want %q", typ, want))
	}
	return payload, nil
}

// WriteFileRaw writes exactly size bytes of src to the file hdr names. ready
// is called once the agent has opened the file, before anything is read
// from src (the daemon answers a client's "Expect: 100-continue" there).
// It is errors.ErrUnsupported, having read nothing, for an agent older than
// protocol 6. A src that ends early or fails, or ctx ending, leaves no new
// file; the error then wraps splice.ErrSource or the context's. taken is
// how many bytes were read from src (all of them on success).
func (c *Conn) WriteFileRaw(ctx context.Context, hdr *sbxv1.WriteFileHeader, size int64, src io.Reader, ready func() error) (resp *sbxv1.WriteFileResponse, taken int64, err error) {
	if !c.rawFiles(ctx) {
		return nil, 0, fmt.Errorf("agent protocol %d takes no raw file connections: %w", c.version.Load(), errors.ErrUnsupported)
	}
	req, err := execframe.FileWriteFrame(size, hdr)
	if err != nil {
		return nil, taken, err
	}
	nc, stop, err := c.dialRaw(ctx)
	if err != nil {
		return nil, taken, err
	}
	defer nc.Close()
	defer stop()
	if _, err := nc.Write(req); err != nil {
		return nil, taken, connect.NewError(connect.CodeUnavailable, fmt.Errorf("sending a file header to the agent: %w", err))
	}
	if _, err := readReply(ctx, nc, execframe.FrameFileReady); err != nil {
		return nil, taken, err
	}
	if ready != nil {
		if err := ready(); err != nil {
			return nil, taken, err
		}
	}
	taken, err = splice.Copy(nc, src, size, RawPipeBytes)
	if err != nil {
		if ctx.Err() != nil {
			return nil, taken, ContextError(ctx)
		}
		if errors.Is(err, splice.ErrSource) {
			return nil, taken, err
		}
		// The agent stopped taking the data: it says why (a full disk, a
		// file writer killed), unless the box is gone.
		_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, rerr := readReply(ctx, nc, execframe.FrameFileDone); rerr != nil {
			var ce *connect.Error
			if errors.As(rerr, &ce) && ce.Code() != connect.CodeUnavailable {
				return nil, taken, rerr
			}
		}
		return nil, taken, connect.NewError(connect.CodeUnavailable, fmt.Errorf("sending file data to the agent (the sandbox stopped or was destroyed?): %w", err))
	}
	payload, err := readReply(ctx, nc, execframe.FrameFileDone)
	if err != nil {
		return nil, taken, err
	}
	resp = &sbxv1.WriteFileResponse{}
	if err := proto.Unmarshal(payload, resp); err != nil {
		return nil, taken, connect.NewError(connect.CodeInternal, fmt.Errorf("agent's file write answer: %w", err))
	}
	return resp, taken, nil
}

// RawRead is a file being read over a raw file connection: Size bytes to
// read from Body. Close it.
type RawRead struct {
	Size int64
	// Body yields exactly Size bytes; an *io.LimitedReader over the
	// connection, so that a TCP connection's ReadFrom splices from it.
	Body *io.LimitedReader
	nc   net.Conn
	stop func() bool
}

// Close ends the transfer (early, if Body is not drained).
func (r *RawRead) Close() error {
	r.stop()
	return r.nc.Close()
}

// ReadFileRaw starts reading the file req names. It is
// errors.ErrUnsupported for an agent older than protocol 6 and for a file
// the agent cannot give a length for up front (not a regular file, or a
// procfs one): read those with ReadFile. Fewer than Size bytes from Body
// means the transfer failed (the file shrank, the box went away).
func (c *Conn) ReadFileRaw(ctx context.Context, req *sbxv1.ReadFileRequest) (*RawRead, error) {
	if !c.rawFiles(ctx) {
		return nil, fmt.Errorf("agent protocol %d takes no raw file connections: %w", c.version.Load(), errors.ErrUnsupported)
	}
	m, err := proto.Marshal(req)
	if err != nil {
		return nil, err
	}
	nc, stop, err := c.dialRaw(ctx)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*RawRead, error) {
		stop()
		nc.Close()
		return nil, err
	}
	if _, err := nc.Write(execframe.AppendFrame(nil, execframe.FrameFileRead, m)); err != nil {
		return fail(connect.NewError(connect.CodeUnavailable, fmt.Errorf("sending a file request to the agent: %w", err)))
	}
	payload, err := readReply(ctx, nc, execframe.FrameFileSize)
	if err != nil {
		if connect.CodeOf(err) == connect.CodeUnimplemented {
			err = fmt.Errorf("%w: %w", err, errors.ErrUnsupported)
		}
		return fail(err)
	}
	size, err := execframe.ParseSize(payload)
	if err != nil {
		return fail(connect.NewError(connect.CodeInternal, err))
	}
	return &RawRead{Size: size, Body: &io.LimitedReader{R: nc, N: size}, nc: nc, stop: stop}, nil
}
