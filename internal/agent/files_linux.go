package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/safepath"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// The file service. Every path a request names goes through s.files (see
// boxFS in boxfs_linux.go): resolved inside the sandbox as user code would
// resolve it, never through a /proc magic link or into the agent's own
// /proc directory, checked and used on the same handle.

// ReadFile streams a file's bytes (a final symlink is followed, as cat
// would).
func (s *Server) ReadFile(ctx context.Context, req *connect.Request[sbxv1.ReadFileRequest], stream *connect.ServerStream[sbxv1.FileChunk]) error {
	p := s.resolve(req.Msg.GetPath())
	off, n := req.Msg.GetOffset(), req.Msg.GetLength()
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
			return fsError("read", p, err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// WriteFile writes a file from a header and data chunks. Unless appending,
// the data goes to a temporary file in the same directory that is renamed
// over the target only once everything arrived: a final symlink is
// replaced, not written through. Appending follows a final symlink (as >>
// would).
func (s *Server) WriteFile(ctx context.Context, stream *connect.ClientStream[sbxv1.WriteFileRequest]) (*connect.Response[sbxv1.WriteFileResponse], error) {
	if !stream.Receive() {
		if err := stream.Err(); err != nil {
			return nil, err
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("write: missing header"))
	}
	pw, err := s.openWrite(ctx, stream.Msg().GetHeader())
	if err != nil {
		return nil, err
	}
	for stream.Receive() {
		data := stream.Msg().GetData()
		if len(data) == 0 {
			continue
		}
		if _, err := pw.sink.Write(data); err != nil {
			return nil, pw.abort(err)
		}
	}
	if err := stream.Err(); err != nil {
		return nil, pw.abort(err)
	}
	if err := ctx.Err(); err != nil {
		return nil, pw.abort(err)
	}
	written, err := pw.commit()
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sbxv1.WriteFileResponse{BytesWritten: written}), nil
}

// pendingWrite is a file being written through the file API (WriteFile or
// a raw file connection): opened, its data going into sink, not yet
// visible under its name unless appending.
type pendingWrite struct {
	p    string // the path, for errors
	name string
	pfd  int // the parent directory (O_PATH)
	f    *os.File
	tmp  string // the temporary file's name in pfd; "" when appending
	mode uint32
	// existing is the entry replaced, if it was a regular file.
	existing *unix.Stat_t
	sink     fileSink
}

// openWrite resolves and opens the file hdr names, as WriteFile does, and
// the sink its data goes into. The caller ends it with commit or abort.
func (s *Server) openWrite(ctx context.Context, hdr *sbxv1.WriteFileHeader) (*pendingWrite, error) {
	if hdr == nil || hdr.GetPath() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("write: first message must be a header with a path"))
	}
	p := s.resolve(hdr.GetPath())
	if p == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("write /: is a directory"))
	}
	mode := uint32(hdr.GetMode()) & 0o777
	if hdr.GetMode() == 0 {
		mode = 0o644
	}
	dir, name := path.Split(p)
	dir = path.Clean(dir)
	var pfd int
	var err error
	if hdr.GetMakeParents() {
		pfd, err = s.files.mkdirAll(dir, 0o755)
	} else {
		pfd, err = s.files.resolve(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	}
	if err != nil {
		return nil, fsError("write", p, err)
	}
	pw := &pendingWrite{p: p, name: name, pfd: pfd, mode: mode}
	// The existing entry, not followed: a symlink is replaced by the new
	// file and lends it nothing.
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			unix.Close(pfd)
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("write %s: is a directory", p))
		case unix.S_IFREG:
			pw.existing = &st
			if hdr.GetMode() == 0 {
				pw.mode = st.Mode & 0o777 // replacing keeps the old permissions
			}
		}
	}
	if hdr.GetAppend() {
		pw.f, err = s.files.openAppend(p, pw.mode)
	} else {
		pw.f, pw.tmp, err = createTemp(pfd, name)
	}
	if err != nil {
		unix.Close(pfd)
		return nil, fsError("write", p, err)
	}
	// The data goes in from the user cgroups (fileWriter): the pages are
	// user code's to pay for, not the agent's reserve.
	pw.sink, err = s.writer.sink(ctx, pw.f)
	if err != nil {
		return nil, pw.fail(err)
	}
	return pw, nil
}

// fail removes what was written and returns err as the file API's error.
func (pw *pendingWrite) fail(err error) error {
	pw.f.Close()
	if pw.tmp != "" {
		unix.Unlinkat(pw.pfd, pw.tmp, 0)
	}
	unix.Close(pw.pfd)
	return fsError("write", pw.p, err)
}

// abort gives up on the data (the helper is told) and fails with err.
func (pw *pendingWrite) abort(err error) error {
	pw.sink.abort()
	return pw.fail(err)
}

// commit ends the data, sets the new file's mode and owner and renames it
// over the target; it returns the bytes written.
func (pw *pendingWrite) commit() (int64, error) {
	written, err := pw.sink.finish()
	if err != nil {
		return 0, pw.fail(err)
	}
	if pw.tmp != "" {
		if err := pw.f.Chmod(fs.FileMode(pw.mode)); err != nil {
			return 0, pw.fail(err)
		}
		if pw.existing != nil {
			pw.f.Chown(int(pw.existing.Uid), int(pw.existing.Gid)) // best effort
		}
	}
	if err := pw.f.Close(); err != nil {
		pw.f = nil
		return 0, pw.failClosed(err)
	}
	defer unix.Close(pw.pfd)
	if pw.tmp != "" {
		if err := unix.Renameat(pw.pfd, pw.tmp, pw.pfd, pw.name); err != nil {
			unix.Unlinkat(pw.pfd, pw.tmp, 0)
			return 0, fsError("write", pw.p, err)
		}
	}
	return written, nil
}

// failClosed is fail once the file is closed.
func (pw *pendingWrite) failClosed(err error) error {
	if pw.tmp != "" {
		unix.Unlinkat(pw.pfd, pw.tmp, 0)
	}
	unix.Close(pw.pfd)
	return fsError("write", pw.p, err)
}

// createTemp creates a new file next to name in the directory dirfd,
// exclusively and never through a symlink, and returns it and its name.
func createTemp(dirfd int, name string) (*os.File, string, error) {
	for range 100 {
		var rnd [6]byte
		rand.Read(rnd[:])
		tmp := "." + name + ".sbx-" + hex.EncodeToString(rnd[:])
		fd, err := unix.Openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err != nil {
			return nil, "", err
		}
		return os.NewFile(uintptr(fd), tmp), tmp, nil
	}
	return nil, "", fmt.Errorf("creating a temporary file next to %s: %w", name, unix.EEXIST)
}

// fileInfo describes the entry p, named name, whose lstat is st; target is
// a symlink's target.
func fileInfo(p, name string, st *unix.Stat_t, target string) *sbxv1.FileInfo {
	fi := safepath.FileInfo(name, st)
	info := &sbxv1.FileInfo{
		Path:    p,
		Name:    name,
		Size:    st.Size,
		Mode:    st.Mode & 0o7777,
		MtimeMs: fi.ModTime().UnixMilli(),
		Uid:     st.Uid,
		Gid:     st.Gid,
	}
	if p == "/" {
		info.Name = "/"
	}
	switch {
	case fi.Mode().IsRegular():
		info.Type = sbxv1.FileType_FILE_TYPE_FILE
	case fi.IsDir():
		info.Type = sbxv1.FileType_FILE_TYPE_DIR
	case fi.Mode()&fs.ModeSymlink != 0:
		info.Type = sbxv1.FileType_FILE_TYPE_SYMLINK
		info.SymlinkTarget = target
	default:
		info.Type = sbxv1.FileType_FILE_TYPE_OTHER
	}
	return info
}

// ListDir lists a directory, recursively if asked, never following
// symlinks below it (the directory asked for may itself be one: think
// /tmp).
func (s *Server) ListDir(ctx context.Context, req *connect.Request[sbxv1.ListDirRequest]) (*connect.Response[sbxv1.ListDirResponse], error) {
	root := s.resolve(req.Msg.GetPath())
	fd, err := s.files.openDir(root)
	if errors.Is(err, unix.ENOTDIR) {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("list %s: not a directory", root))
	}
	if err != nil {
		return nil, fsError("list", root, err)
	}
	defer unix.Close(fd)
	maxDepth := 1
	if req.Msg.GetRecursive() {
		maxDepth = int(req.Msg.GetMaxDepth())
	}
	var entries []*sbxv1.FileInfo
	err = s.files.walk(fd, func(parent int, rel, name string, st *unix.Stat_t) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		target := ""
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			target, _ = readlinkAt(parent, name)
		}
		entries = append(entries, fileInfo(path.Join(root, rel), name, st, target))
		if st.Mode&unix.S_IFMT == unix.S_IFDIR && maxDepth > 0 && strings.Count(rel, "/")+1 >= maxDepth {
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

// Stat describes a path without following a final symlink.
func (s *Server) Stat(_ context.Context, req *connect.Request[sbxv1.StatRequest]) (*connect.Response[sbxv1.StatResponse], error) {
	p := s.resolve(req.Msg.GetPath())
	st, err := s.files.lstat(p)
	if err != nil {
		return nil, fsError("stat", p, err)
	}
	target := ""
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		target, _ = s.files.readlink(p)
	}
	return connect.NewResponse(&sbxv1.StatResponse{Info: fileInfo(p, path.Base(p), st, target)}), nil
}

// MakeDir creates a directory (and its parents if asked).
func (s *Server) MakeDir(_ context.Context, req *connect.Request[sbxv1.MakeDirRequest]) (*connect.Response[sbxv1.MakeDirResponse], error) {
	p := s.resolve(req.Msg.GetPath())
	mode := req.Msg.GetMode() & 0o777
	if mode == 0 {
		mode = 0o755
	}
	var err error
	if req.Msg.GetParents() {
		var fd int
		if fd, err = s.files.mkdirAll(p, mode); err == nil {
			unix.Close(fd)
		}
	} else {
		err = s.files.mkdir(p, mode)
	}
	if err != nil {
		return nil, fsError("mkdir", p, err)
	}
	return connect.NewResponse(&sbxv1.MakeDirResponse{}), nil
}

// Remove deletes a path (a symlink itself, never its target), recursively
// if asked. It refuses to remove "/".
func (s *Server) Remove(_ context.Context, req *connect.Request[sbxv1.RemoveRequest]) (*connect.Response[sbxv1.RemoveResponse], error) {
	if req.Msg.GetPath() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("remove: path is required"))
	}
	p := s.resolve(req.Msg.GetPath())
	if p == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("remove /: refusing to remove the root directory"))
	}
	if err := s.files.remove(p, req.Msg.GetRecursive()); err != nil {
		return nil, fsError("remove", p, err)
	}
	return connect.NewResponse(&sbxv1.RemoveResponse{}), nil
}

// Rename moves a path (within one file system; neither final component is
// followed).
func (s *Server) Rename(_ context.Context, req *connect.Request[sbxv1.RenameRequest]) (*connect.Response[sbxv1.RenameResponse], error) {
	if req.Msg.GetFrom() == "" || req.Msg.GetTo() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("rename: from and to are required"))
	}
	from, to := s.resolve(req.Msg.GetFrom()), s.resolve(req.Msg.GetTo())
	if from == "/" || to == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("rename: refusing to move the root directory"))
	}
	if err := s.files.rename(from, to); err != nil {
		return nil, fsError("rename", from+" -> "+to, err)
	}
	return connect.NewResponse(&sbxv1.RenameResponse{}), nil
}
