package agent

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"connectrpc.com/connect"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// DownloadTar streams a tar of a directory's contents (entry names relative
// to it, so UploadTar into another directory recreates the tree) or of a
// single file (one entry named after it). Symlinks are archived as links,
// never followed.
func (s *Server) DownloadTar(ctx context.Context, req *connect.Request[sbxv1.DownloadTarRequest], stream *connect.ServerStream[sbxv1.FileChunk]) error {
	root := s.resolve(req.Msg.GetPath())
	fi, err := os.Lstat(root)
	if err != nil {
		return fsError("download", root, err)
	}
	cw := &chunkWriter{send: stream.Send, buf: make([]byte, 0, fileChunkSize)}
	tw := tar.NewWriter(cw)
	if !fi.IsDir() {
		err = addTarEntry(tw, root, filepath.Base(root), fi)
	} else {
		err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if p == root {
					return err
				}
				return nil // unreadable subdirectory: archive what we can
			}
			if p == root {
				return nil
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return nil // vanished meanwhile
			}
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			return addTarEntry(tw, p, filepath.ToSlash(rel), fi)
		})
	}
	if err != nil {
		if cw.err != nil {
			return cw.err
		}
		return fsError("download", root, err)
	}
	if err := tw.Close(); err != nil {
		return fsError("download", root, err)
	}
	return cw.flush()
}

// addTarEntry appends path (Lstat'ed into fi) to tw as name. Sockets and
// other unarchivable files are skipped.
func addTarEntry(tw *tar.Writer, path, name string, fi fs.FileInfo) error {
	link := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		var err error
		if link, err = os.Readlink(path); err != nil {
			return nil
		}
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return nil // e.g. a socket
	}
	hdr.Name = name
	if fi.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uname, hdr.Gname = "", ""
	if !fi.Mode().IsRegular() {
		return tw.WriteHeader(hdr)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil // replaced or unreadable meanwhile
	}
	defer f.Close()
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	// The file may shrink while we read it; pad so the archive stays valid.
	_, err = io.CopyN(tw, io.MultiReader(f, zeros{}), hdr.Size)
	return err
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// chunkWriter turns writes into FileChunk messages of up to fileChunkSize.
type chunkWriter struct {
	send func(*sbxv1.FileChunk) error
	buf  []byte
	err  error // first send error
}

func (w *chunkWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(len(p), cap(w.buf)-len(w.buf))
		w.buf = append(w.buf, p[:k]...)
		p = p[k:]
		if len(w.buf) == cap(w.buf) {
			if err := w.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (w *chunkWriter) flush() error {
	if w.err != nil {
		return w.err
	}
	if len(w.buf) == 0 {
		return nil
	}
	w.err = w.send(&sbxv1.FileChunk{Data: w.buf})
	w.buf = w.buf[:0]
	return w.err
}

// UploadTar extracts a tar stream into a directory. The archive is treated
// as hostile; see extractTar.
func (s *Server) UploadTar(ctx context.Context, stream *connect.ClientStream[sbxv1.UploadTarRequest]) (*connect.Response[sbxv1.UploadTarResponse], error) {
	if !stream.Receive() {
		if err := stream.Err(); err != nil {
			return nil, err
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("upload tar: missing header"))
	}
	hdr := stream.Msg().GetHeader()
	if hdr == nil || hdr.GetPath() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("upload tar: first message must be a header with a path"))
	}
	dest := s.resolve(hdr.GetPath())
	if err := os.MkdirAll(dest, 0o755); err != nil {
		return nil, fsError("upload tar to", dest, err)
	}
	r := &streamReader{stream: stream}
	files, bytes, err := extractTar(ctx, dest, r)
	if err != nil {
		if r.err != nil {
			return nil, r.err
		}
		return nil, fsError("upload tar to", dest, err)
	}
	return connect.NewResponse(&sbxv1.UploadTarResponse{Files: files, Bytes: bytes}), nil
}

// streamReader reads the data messages of an UploadTar stream.
type streamReader struct {
	stream *connect.ClientStream[sbxv1.UploadTarRequest]
	buf    []byte
	err    error // the stream's own error, if it failed
}

func (r *streamReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if !r.stream.Receive() {
			if err := r.stream.Err(); err != nil {
				r.err = err
				return 0, err
			}
			return 0, io.EOF
		}
		r.buf = r.stream.Msg().GetData()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// badEntry is an archive entry extractTar refuses.
func badEntry(name, why string) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("tar entry %q: %s", name, why))
}
