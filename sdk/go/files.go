package sbx

import (
	"bytes"
	"context"
	"errors"
	"io"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// chunkSize is the size of the data messages uploads send: large enough
// that per-message costs (framing, a syscall or two per hop, the agent's
// write) vanish beside the copying, small enough to keep what each hop
// buffers per stream modest.
const chunkSize = 1 << 20

// ReadFile returns a whole file of the sandbox.
func (s *Sandbox) ReadFile(ctx context.Context, path string) ([]byte, error) {
	var buf bytes.Buffer
	if err := s.Download(ctx, path, &buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Download streams a file of the sandbox to w.
func (s *Sandbox) Download(ctx context.Context, path string, w io.Writer) error {
	if s.c.useRaw() {
		err := s.downloadRaw(ctx, path, w)
		if !errors.Is(err, errNoRawRoute) {
			return wrap("read "+path, err)
		}
		s.c.noRawFiles.Store(true)
	}
	stream, err := s.c.files.ReadFile(ctx, connect.NewRequest(&sbxv1.ReadFileRequest{Sandbox: s.ID, Path: path}))
	if err != nil {
		return wrap("read "+path, err)
	}
	defer stream.Close()
	for stream.Receive() {
		if _, err := w.Write(stream.Msg().GetData()); err != nil {
			return err
		}
	}
	return wrap("read "+path, stream.Err())
}

// WriteFile writes data to a file of the sandbox (mode 0 means 0644),
// creating missing parent directories.
func (s *Sandbox) WriteFile(ctx context.Context, path string, data []byte, mode uint32) error {
	_, err := s.Upload(ctx, path, bytes.NewReader(data), mode)
	return err
}

// Upload streams r into a file of the sandbox, creating missing parents. The
// file appears whole or not at all. A reader whose size is known up front (a
// regular *os.File, or one with a Len method giving the bytes left unread,
// as *bytes.Reader has) of at least 1 MiB goes over the daemon's raw file
// route, spliced to the sandbox (rawfiles.go).
func (s *Sandbox) Upload(ctx context.Context, path string, r io.Reader, mode uint32) (int64, error) {
	return s.upload(ctx, path, r, mode, false)
}

// AppendFile appends data to a file of the sandbox, creating it (and its
// missing parents) if need be.
func (s *Sandbox) AppendFile(ctx context.Context, path string, data []byte, mode uint32) error {
	_, err := s.upload(ctx, path, bytes.NewReader(data), mode, true)
	return err
}

func (s *Sandbox) upload(ctx context.Context, path string, r io.Reader, mode uint32, appendTo bool) (int64, error) {
	if size, ok := knownSize(r); ok && size >= rawUploadMin && s.c.useRaw() {
		n, err := s.uploadRaw(ctx, path, r, size, mode, appendTo)
		if !errors.Is(err, errNoRawRoute) {
			return n, wrap("write "+path, err)
		}
		// An old daemon: it answered before the body was sent
		// (100-continue), so r is as it was.
		s.c.noRawFiles.Store(true)
	}
	stream := s.c.files.WriteFile(ctx)
	hdr := &sbxv1.WriteFileRequest{Msg: &sbxv1.WriteFileRequest_Header{Header: &sbxv1.WriteFileHeader{
		Sandbox: s.ID, Path: path, Mode: mode, MakeParents: true, Append: appendTo,
	}}}
	if err := sendChunks(stream.Send, hdr, r, func(b []byte) *sbxv1.WriteFileRequest {
		return &sbxv1.WriteFileRequest{Msg: &sbxv1.WriteFileRequest_Data{Data: b}}
	}); err != nil {
		stream.CloseAndReceive() //nolint:errcheck
		return 0, wrap("write "+path, err)
	}
	resp, err := stream.CloseAndReceive()
	if err != nil {
		return 0, wrap("write "+path, err)
	}
	return resp.Msg.GetBytesWritten(), nil
}

// sendChunks sends first, then r in chunks. An io.EOF from send means the
// server ended the stream early; its error comes from CloseAndReceive.
func sendChunks[T any](send func(*T) error, first *T, r io.Reader, chunk func([]byte) *T) error {
	if err := send(first); err != nil {
		return ignoreEOF(err)
	}
	// send marshals the message before it returns, so buf is reused.
	buf := make([]byte, chunkSize)
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			if serr := send(chunk(buf[:n])); serr != nil {
				return ignoreEOF(serr)
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// UploadTar extracts a tar stream into dir of the sandbox.
func (s *Sandbox) UploadTar(ctx context.Context, dir string, r io.Reader) (*sbxv1.UploadTarResponse, error) {
	stream := s.c.files.UploadTar(ctx)
	hdr := &sbxv1.UploadTarRequest{Msg: &sbxv1.UploadTarRequest_Header{Header: &sbxv1.UploadTarHeader{Sandbox: s.ID, Path: dir}}}
	if err := sendChunks(stream.Send, hdr, r, func(b []byte) *sbxv1.UploadTarRequest {
		return &sbxv1.UploadTarRequest{Msg: &sbxv1.UploadTarRequest_Data{Data: b}}
	}); err != nil {
		stream.CloseAndReceive() //nolint:errcheck
		return nil, wrap("upload tar to "+dir, err)
	}
	resp, err := stream.CloseAndReceive()
	if err != nil {
		return nil, wrap("upload tar to "+dir, err)
	}
	return resp.Msg, nil
}

// DownloadTar streams path (a directory or file) of the sandbox as a tar to w.
func (s *Sandbox) DownloadTar(ctx context.Context, path string, w io.Writer) error {
	stream, err := s.c.files.DownloadTar(ctx, connect.NewRequest(&sbxv1.DownloadTarRequest{Sandbox: s.ID, Path: path}))
	if err != nil {
		return wrap("download "+path, err)
	}
	defer stream.Close()
	for stream.Receive() {
		if _, err := w.Write(stream.Msg().GetData()); err != nil {
			return err
		}
	}
	return wrap("download "+path, stream.Err())
}

// ListDir lists a directory; recursive walks down to maxDepth levels (0: all).
func (s *Sandbox) ListDir(ctx context.Context, path string, recursive bool, maxDepth int) ([]*sbxv1.FileInfo, error) {
	resp, err := s.c.api.ListDir(ctx, connect.NewRequest(&sbxv1.ListDirRequest{Sandbox: s.ID, Path: path, Recursive: recursive, MaxDepth: int32(maxDepth)}))
	if err != nil {
		return nil, wrap("list "+path, err)
	}
	return resp.Msg.GetEntries(), nil
}

// Stat describes one path (symlinks are not followed).
func (s *Sandbox) Stat(ctx context.Context, path string) (*sbxv1.FileInfo, error) {
	resp, err := s.c.api.Stat(ctx, connect.NewRequest(&sbxv1.StatRequest{Sandbox: s.ID, Path: path}))
	if err != nil {
		return nil, wrap("stat "+path, err)
	}
	return resp.Msg.GetInfo(), nil
}

// MakeDir creates a directory (and its parents if parents is true).
func (s *Sandbox) MakeDir(ctx context.Context, path string, parents bool) error {
	_, err := s.c.api.MakeDir(ctx, connect.NewRequest(&sbxv1.MakeDirRequest{Sandbox: s.ID, Path: path, Parents: parents}))
	return wrap("mkdir "+path, err)
}

// Remove deletes a path (a directory only with recursive).
func (s *Sandbox) Remove(ctx context.Context, path string, recursive bool) error {
	_, err := s.c.api.Remove(ctx, connect.NewRequest(&sbxv1.RemoveRequest{Sandbox: s.ID, Path: path, Recursive: recursive}))
	return wrap("remove "+path, err)
}

// Rename moves a path within the sandbox.
func (s *Sandbox) Rename(ctx context.Context, from, to string) error {
	_, err := s.c.api.Rename(ctx, connect.NewRequest(&sbxv1.RenameRequest{Sandbox: s.ID, From: from, To: to}))
	return wrap("rename "+from+" -> "+to, err)
}
