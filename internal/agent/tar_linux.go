package agent

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/safepath"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// DownloadTar streams a tar of a directory's contents (entry names relative
// to it, so UploadTar into another directory recreates the tree) or of a
// single file (one entry named after it). Symlinks are archived as links,
// never followed, the path asked for included. Files are opened through
// their directory's handle and checked on the handle that is read (see
// boxFS).
func (s *Server) DownloadTar(ctx context.Context, req *connect.Request[sbxv1.DownloadTarRequest], stream *connect.ServerStream[sbxv1.FileChunk]) error {
	root := s.resolve(req.Msg.GetPath())
	cw := &chunkWriter{send: stream.Send, buf: make([]byte, 0, fileChunkSize)}
	tw := tar.NewWriter(cw)
	err := s.tarPath(ctx, tw, root)
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

// tarPath writes root (a file, symlink or the contents of a directory) to tw.
func (s *Server) tarPath(ctx context.Context, tw *tar.Writer, root string) error {
	var fd int
	var err error
	if root == "/" {
		fd, err = s.files.openDir(root)
	} else {
		var pfd int
		var name string
		if pfd, name, err = s.files.parent(root); err != nil {
			return err
		}
		defer unix.Close(pfd)
		var st unix.Stat_t
		if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return addTarEntry(tw, pfd, name, name, &st)
		}
		fd, err = openat2(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0, beneath)
		if err == nil {
			if err = s.files.check(fd); err != nil {
				unix.Close(fd)
			}
		}
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return s.files.walk(fd, func(parent int, rel, name string, st *unix.Stat_t) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return addTarEntry(tw, parent, name, rel, st)
	})
}

// addTarEntry appends the entry name of the directory parent (lstat'ed
// into st) to tw as archiveName. Sockets and other unarchivable files are
// skipped, and so is a file replaced since it was listed.
func addTarEntry(tw *tar.Writer, parent int, name, archiveName string, st *unix.Stat_t) error {
	fi := safepath.FileInfo(name, st)
	link := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		var err error
		if link, err = readlinkAt(parent, name); err != nil {
			return nil
		}
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return nil // e.g. a socket
	}
	hdr.Name = archiveName
	if fi.IsDir() {
		hdr.Name += "/"
	}
	hdr.Mode = int64(st.Mode & 0o7777)
	hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
	if !fi.Mode().IsRegular() {
		return tw.WriteHeader(hdr)
	}
	f, err := openBeneath(parent, name)
	if err != nil {
		return nil // replaced or unreadable meanwhile
	}
	defer f.Close()
	var now unix.Stat_t
	if unix.Fstat(int(f.Fd()), &now) != nil || now.Ino != st.Ino || now.Dev != st.Dev {
		return nil // replaced since listed
	}
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
	destFd, err := s.files.mkdirAll(dest, 0o755)
	if err != nil {
		return nil, fsError("upload tar to", dest, err)
	}
	defer unix.Close(destFd)
	r := &streamReader{stream: stream}
	files, bytes, err := extractTar(ctx, s.files, s.writer, destFd, r)
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
