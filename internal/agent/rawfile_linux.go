package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/sbxdev/sbx/api/execframe"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/splice"
)

// Raw file connections (protocol 6, api/execframe's rawfile.go): one file's
// bytes as a plain stream on a connection of their own, spliced between the
// socket and the file, so that neither the agent nor the daemon copies them
// through protobuf messages. Every path goes through the same checks as the
// file RPCs (openWrite, s.files.openRead), and written data through the
// same file writer in the user cgroups.

// serveRawFile serves the one transfer of a raw file connection whose
// first byte (FrameFileWrite or FrameFileRead) c has peeked.
func (s *Server) serveRawFile(ctx context.Context, c *peekedConn) {
	defer c.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The daemon closing the connection (its client left, the box is being
	// destroyed) ends the transfer: the file is then left as it was.
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	typ, payload, err := execframe.ReadFrameUnbuffered(c, execframe.MaxFileHeader)
	if err != nil {
		return
	}
	switch typ {
	case execframe.FrameFileWrite:
		err = s.rawWrite(ctx, c, payload)
	case execframe.FrameFileRead:
		err = s.rawRead(c, payload)
	default:
		err = connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("raw file connection: frame %q is no file request", typ))
	}
	if err != nil {
		writeRawError(c, err)
	}
}

// writeRawError answers a raw file connection with err as a FrameError.
func writeRawError(c net.Conn, err error) {
	code, msg := connect.CodeInternal, err.Error()
	if ce := new(connect.Error); errors.As(err, &ce) {
		code, msg = ce.Code(), ce.Message()
	}
	_, _ = c.Write(execframe.AppendErrorFrame(nil, uint32(code), msg))
}

// rawWrite writes the file a FrameFileWrite frame names from the raw bytes
// after it. An error after the data began leaves no file (or, appending,
// what was appended so far, as an interrupted WriteFile would).
func (s *Server) rawWrite(ctx context.Context, c *peekedConn, payload []byte) error {
	size, hdr, err := execframe.ParseFileWrite(payload)
	if err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	pw, err := s.openWrite(ctx, hdr)
	if err != nil {
		return err
	}
	if _, err := c.Conn.Write(execframe.AppendFrame(nil, execframe.FrameFileReady, nil)); err != nil {
		return pw.abort(err)
	}
	// Bytes read with the peek and the header go first; the rest is
	// spliced from the socket itself.
	var got int64
	if k := int64(c.r.Buffered()); k > 0 {
		k = min(k, size)
		n, err := pw.sink.copyFrom(c.r, k)
		got += n
		if err != nil {
			return pw.abort(err)
		}
	}
	n, err := pw.sink.copyFrom(c.Conn, size-got)
	got += n
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return pw.abort(fmt.Errorf("after %d of %d bytes: %w", got, size, err))
	}
	written, err := pw.commit()
	if err != nil {
		return err
	}
	b, err := proto.Marshal(&sbxv1.WriteFileResponse{BytesWritten: written})
	if err != nil {
		return err
	}
	_, err = c.Conn.Write(execframe.AppendFrame(nil, execframe.FrameFileDone, b))
	return err
}

// rawRead sends the file a FrameFileRead frame names: its length, then its
// bytes spliced from the file to the socket.
func (s *Server) rawRead(c *peekedConn, payload []byte) error {
	req := &sbxv1.ReadFileRequest{}
	if err := proto.Unmarshal(payload, req); err != nil {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("raw file read: %w", err))
	}
	p := s.resolve(req.GetPath())
	off, n := req.GetOffset(), req.GetLength()
	if off < 0 || n < 0 {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("read %s: negative offset or length", p))
	}
	f, err := s.files.openRead(p)
	if errors.Is(err, unix.EISDIR) {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("read %s: is a directory", p))
	}
	if err != nil {
		return fsError("read", p, err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fsError("read", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size == 0 {
		return connect.NewError(connect.CodeUnimplemented, fmt.Errorf("read %s: no length known up front (not a regular file, or a size of 0): read it with ReadFile", p))
	}
	size := max(st.Size-off, 0)
	if n > 0 {
		size = min(size, n)
	}
	if off > 0 {
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			return fsError("read", p, err)
		}
	}
	if _, err := c.Conn.Write(execframe.SizeFrame(size)); err != nil {
		return nil // the daemon is gone
	}
	// A file that shrinks meanwhile ends the stream short: the daemon
	// takes that as the error it is. Nothing more can be said in-band.
	// The pipe this splices through holds the page cache's pages by
	// reference; it is grown to 1 MiB if one of the agent's bigPipes is
	// free (filewriter_linux.go), like the file writer's.
	pipe, done := bigPipeSize()
	defer done()
	if _, err := splice.Copy(c.Conn, f, size, pipe); err != nil {
		c.Close()
	}
	return nil
}
