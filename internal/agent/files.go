package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"connectrpc.com/connect"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// fileChunkSize is the size of the FileChunk messages ReadFile and
// DownloadTar stream.
const fileChunkSize = 64 << 10

// fsError converts a file system error into a connect error naming path.
func fsError(op, path string, err error) error {
	if err == nil {
		return nil
	}
	if ce := new(connect.Error); errors.As(err, &ce) {
		return connect.NewError(ce.Code(), fmt.Errorf("%s %s: %s", op, path, ce.Message()))
	}
	code := connect.CodeInternal
	var errno syscall.Errno
	switch {
	// Specific errnos first: ENOTEMPTY, for one, also matches fs.ErrExist.
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EXDEV),
		errors.Is(err, syscall.ELOOP), errors.Is(err, syscall.EBUSY):
		code = connect.CodeFailedPrecondition
	case errors.Is(err, fs.ErrNotExist):
		code = connect.CodeNotFound
	case errors.Is(err, fs.ErrExist):
		code = connect.CodeAlreadyExists
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		code = connect.CodePermissionDenied
	case errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.ENAMETOOLONG):
		code = connect.CodeInvalidArgument
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		code = connect.CodeResourceExhausted
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	}
	// The message names path already; drop the path of the os error itself.
	msg := err.Error()
	var pe *fs.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe) && pe == err:
		msg = pe.Err.Error()
	case errors.As(err, &le) && le == err:
		msg = le.Err.Error()
	case errors.As(err, &errno) && errno == err:
		msg = errno.Error()
	}
	return connect.NewError(code, fmt.Errorf("%s %s: %s", op, path, msg))
}

// ReadFile streams a file's bytes.
func (s *Server) ReadFile(ctx context.Context, req *connect.Request[sbxv1.ReadFileRequest], stream *connect.ServerStream[sbxv1.FileChunk]) error {
	path := s.resolve(req.Msg.GetPath())
	off, n := req.Msg.GetOffset(), req.Msg.GetLength()
	if off < 0 || n < 0 {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("read %s: negative offset or length", path))
	}
	// Stat first: opening a FIFO would block until someone writes to it.
	fi, err := os.Stat(path)
	if err != nil {
		return fsError("read", path, err)
	}
	switch {
	case fi.IsDir():
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("read %s: is a directory", path))
	case fi.Mode()&(fs.ModeNamedPipe|fs.ModeSocket) != 0:
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("read %s: not a regular file", path))
	}
	f, err := os.Open(path)
	if err != nil {
		return fsError("read", path, err)
	}
	defer f.Close()
	var r io.Reader = f
	if off > 0 {
		r = io.NewSectionReader(f, off, 1<<62)
	}
	if n > 0 {
		r = io.LimitReader(r, n)
	}
	buf := make([]byte, fileChunkSize)
	for {
		k, err := io.ReadFull(r, buf)
		if k > 0 {
			if err := stream.Send(&sbxv1.FileChunk{Data: buf[:k]}); err != nil {
				return err
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil
		}
		if err != nil {
			return fsError("read", path, err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// WriteFile writes a file from a header and data chunks. Unless appending,
// the data goes to a temporary file in the same directory that is renamed
// over the target only once everything arrived.
func (s *Server) WriteFile(ctx context.Context, stream *connect.ClientStream[sbxv1.WriteFileRequest]) (*connect.Response[sbxv1.WriteFileResponse], error) {
	if !stream.Receive() {
		if err := stream.Err(); err != nil {
			return nil, err
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("write: missing header"))
	}
	hdr := stream.Msg().GetHeader()
	if hdr == nil || hdr.GetPath() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("write: first message must be a header with a path"))
	}
	path := s.resolve(hdr.GetPath())
	mode := fs.FileMode(hdr.GetMode()) & fs.ModePerm
	if hdr.GetMode() == 0 {
		mode = 0o644
	}
	dir := filepath.Dir(path)
	if hdr.GetMakeParents() {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fsError("write", path, err)
		}
	}
	existing, err := os.Stat(path)
	switch {
	case err == nil && existing.IsDir():
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("write %s: is a directory", path))
	case err == nil && hdr.GetMode() == 0:
		mode = existing.Mode().Perm() // replacing keeps the old permissions
	}

	var f *os.File
	if hdr.GetAppend() {
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, mode)
	} else {
		f, err = os.CreateTemp(dir, "."+filepath.Base(path)+".sbx-*")
	}
	if err != nil {
		return nil, fsError("write", path, err)
	}
	tmp := ""
	if !hdr.GetAppend() {
		tmp = f.Name()
	}
	fail := func(err error) (*connect.Response[sbxv1.WriteFileResponse], error) {
		f.Close()
		if tmp != "" {
			os.Remove(tmp)
		}
		return nil, fsError("write", path, err)
	}
	var written int64
	for stream.Receive() {
		data := stream.Msg().GetData()
		if len(data) == 0 {
			continue
		}
		k, err := f.Write(data)
		written += int64(k)
		if err != nil {
			return fail(err)
		}
	}
	if err := stream.Err(); err != nil {
		return fail(err)
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	if tmp != "" {
		if err := f.Chmod(mode); err != nil {
			return fail(err)
		}
		if existing != nil {
			if st, ok := existing.Sys().(*syscall.Stat_t); ok {
				f.Chown(int(st.Uid), int(st.Gid)) // best effort
			}
		}
	}
	if err := f.Close(); err != nil {
		return fail(err)
	}
	if tmp != "" {
		if err := os.Rename(tmp, path); err != nil {
			os.Remove(tmp)
			return nil, fsError("write", path, err)
		}
	}
	return connect.NewResponse(&sbxv1.WriteFileResponse{BytesWritten: written}), nil
}

// fileInfo describes path, which was Lstat'ed into fi.
func fileInfo(path string, fi fs.FileInfo) *sbxv1.FileInfo {
	info := &sbxv1.FileInfo{
		Path:    path,
		Name:    fi.Name(),
		Size:    fi.Size(),
		Mode:    uint32(fi.Mode().Perm()),
		MtimeMs: fi.ModTime().UnixMilli(),
	}
	if path == "/" {
		info.Name = "/"
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		info.Mode = uint32(st.Mode) & 0o7777
		info.Uid, info.Gid = st.Uid, st.Gid
	}
	switch {
	case fi.Mode().IsRegular():
		info.Type = sbxv1.FileType_FILE_TYPE_FILE
	case fi.IsDir():
		info.Type = sbxv1.FileType_FILE_TYPE_DIR
	case fi.Mode()&fs.ModeSymlink != 0:
		info.Type = sbxv1.FileType_FILE_TYPE_SYMLINK
		info.SymlinkTarget, _ = os.Readlink(path)
	default:
		info.Type = sbxv1.FileType_FILE_TYPE_OTHER
	}
	return info
}

// ListDir lists a directory, recursively if asked, never following symlinks.
func (s *Server) ListDir(ctx context.Context, req *connect.Request[sbxv1.ListDirRequest]) (*connect.Response[sbxv1.ListDirResponse], error) {
	root := s.resolve(req.Msg.GetPath())
	// The directory asked for may itself be a symlink (think /tmp); only
	// symlinks below it are not followed.
	fi, err := os.Stat(root)
	if err != nil {
		return nil, fsError("list", root, err)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("list %s: not a directory", root))
	}
	walkRoot := root
	if root != "/" {
		walkRoot += "/" // makes WalkDir's Lstat of the root follow a symlink
	}
	maxDepth := 1
	if req.Msg.GetRecursive() {
		maxDepth = int(req.Msg.GetMaxDepth())
	}
	var entries []*sbxv1.FileInfo
	err = filepath.WalkDir(walkRoot, func(p string, d fs.DirEntry, err error) error {
		if p == walkRoot {
			return err
		}
		if err != nil {
			return nil // unreadable subdirectory: list what we can
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return nil // vanished meanwhile
		}
		entries = append(entries, fileInfo(p, fi))
		if d.IsDir() && maxDepth > 0 && depth(root, p) >= maxDepth {
			return fs.SkipDir
		}
		return nil
	})
	if err != nil {
		return nil, fsError("list", root, err)
	}
	slices.SortFunc(entries, func(a, b *sbxv1.FileInfo) int { return strings.Compare(a.Path, b.Path) })
	return connect.NewResponse(&sbxv1.ListDirResponse{Entries: entries}), nil
}

// depth is how many path elements p has below root.
func depth(root, p string) int {
	rel, err := filepath.Rel(root, p)
	if err != nil {
		return 0
	}
	return strings.Count(rel, string(filepath.Separator)) + 1
}

// Stat describes a path without following a final symlink.
func (s *Server) Stat(_ context.Context, req *connect.Request[sbxv1.StatRequest]) (*connect.Response[sbxv1.StatResponse], error) {
	path := s.resolve(req.Msg.GetPath())
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, fsError("stat", path, err)
	}
	return connect.NewResponse(&sbxv1.StatResponse{Info: fileInfo(path, fi)}), nil
}

// MakeDir creates a directory (and its parents if asked).
func (s *Server) MakeDir(_ context.Context, req *connect.Request[sbxv1.MakeDirRequest]) (*connect.Response[sbxv1.MakeDirResponse], error) {
	path := s.resolve(req.Msg.GetPath())
	mode := fs.FileMode(req.Msg.GetMode()) & fs.ModePerm
	if mode == 0 {
		mode = 0o755
	}
	var err error
	if req.Msg.GetParents() {
		err = os.MkdirAll(path, mode)
	} else {
		err = os.Mkdir(path, mode)
	}
	if err != nil {
		return nil, fsError("mkdir", path, err)
	}
	return connect.NewResponse(&sbxv1.MakeDirResponse{}), nil
}

// Remove deletes a path, recursively if asked. It refuses to remove "/".
func (s *Server) Remove(_ context.Context, req *connect.Request[sbxv1.RemoveRequest]) (*connect.Response[sbxv1.RemoveResponse], error) {
	if req.Msg.GetPath() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("remove: path is required"))
	}
	path := s.resolve(req.Msg.GetPath())
	if path == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("remove /: refusing to remove the root directory"))
	}
	if _, err := os.Lstat(path); err != nil {
		return nil, fsError("remove", path, err)
	}
	var err error
	if req.Msg.GetRecursive() {
		err = os.RemoveAll(path)
	} else {
		err = os.Remove(path)
	}
	if err != nil {
		return nil, fsError("remove", path, err)
	}
	return connect.NewResponse(&sbxv1.RemoveResponse{}), nil
}

// Rename moves a path (within one file system).
func (s *Server) Rename(_ context.Context, req *connect.Request[sbxv1.RenameRequest]) (*connect.Response[sbxv1.RenameResponse], error) {
	if req.Msg.GetFrom() == "" || req.Msg.GetTo() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("rename: from and to are required"))
	}
	from, to := s.resolve(req.Msg.GetFrom()), s.resolve(req.Msg.GetTo())
	if err := os.Rename(from, to); err != nil {
		return nil, fsError("rename", from+" -> "+to, err)
	}
	return connect.NewResponse(&sbxv1.RenameResponse{}), nil
}
