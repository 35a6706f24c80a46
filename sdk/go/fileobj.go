package sbx

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"

	"connectrpc.com/connect"
)

// SandboxFile is a file of a sandbox opened with Sandbox.OpenFile: an io.Reader,
// io.Writer, io.Seeker and io.Closer over a local copy (Modal's
// Sandbox.open). Opening for reading fetches the file; Sync and Close send
// what was written, the whole file at once (it appears whole or not at all),
// or with O_APPEND only the new bytes, appended. A SandboxFile is not safe for
// concurrent use.
type SandboxFile struct {
	sb     *Sandbox
	path   string
	flag   int
	perm   uint32
	buf    []byte
	off    int64
	sent   int // O_APPEND: bytes of buf already appended
	dirty  bool
	closed bool
}

// Open opens a file of the sandbox for reading.
func (s *Sandbox) Open(ctx context.Context, path string) (*SandboxFile, error) {
	return s.OpenFile(ctx, path, os.O_RDONLY, 0)
}

// OpenFile opens a file of the sandbox with os.OpenFile's flags (O_RDONLY,
// O_WRONLY or O_RDWR, with O_CREATE, O_EXCL, O_TRUNC, O_APPEND); perm (0:
// 0644) is a created file's mode. O_CREATE and O_TRUNC take effect at once,
// as with a local file.
func (s *Sandbox) OpenFile(ctx context.Context, path string, flag int, perm fs.FileMode) (*SandboxFile, error) {
	if perm == 0 {
		perm = 0o644
	}
	f := &SandboxFile{sb: s, path: path, flag: flag, perm: uint32(perm.Perm())}
	access := flag & (os.O_RDONLY | os.O_WRONLY | os.O_RDWR)
	if access != os.O_RDONLY && access != os.O_WRONLY && access != os.O_RDWR {
		return nil, fmt.Errorf("open %s: flags %#x: want one of O_RDONLY, O_WRONLY, O_RDWR", path, flag)
	}
	_, statErr := s.Stat(ctx, path)
	exists := statErr == nil
	switch {
	case statErr != nil && !IsNotFound(statErr):
		return nil, statErr
	case exists && flag&os.O_CREATE != 0 && flag&os.O_EXCL != 0:
		return nil, &Error{Op: "open " + path, Code: connect.CodeAlreadyExists, Msg: "open " + path + ": it exists (O_EXCL)"}
	case !exists && flag&os.O_CREATE == 0:
		return nil, statErr
	}
	keep := exists && flag&os.O_TRUNC == 0
	if keep && (access != os.O_WRONLY || flag&os.O_APPEND == 0) {
		// Read the content unless the file is only appended to.
		var b bytes.Buffer
		if err := s.Download(ctx, path, &b); err != nil {
			return nil, err
		}
		f.buf = b.Bytes()
		if flag&os.O_APPEND != 0 {
			f.sent = len(f.buf)
		}
	}
	if !exists || flag&os.O_TRUNC != 0 {
		if _, err := s.upload(ctx, path, bytes.NewReader(nil), f.perm, false); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// Name is the path in the sandbox.
func (f *SandboxFile) Name() string { return f.path }

func (f *SandboxFile) check(write bool) error {
	if f.closed {
		return fmt.Errorf("%s: %w", f.path, os.ErrClosed)
	}
	access := f.flag & (os.O_RDONLY | os.O_WRONLY | os.O_RDWR)
	if write && access == os.O_RDONLY {
		return fmt.Errorf("write %s: opened read-only", f.path)
	}
	if !write && access == os.O_WRONLY {
		return fmt.Errorf("read %s: opened write-only", f.path)
	}
	return nil
}

// Read reads from the local copy.
func (f *SandboxFile) Read(p []byte) (int, error) {
	if err := f.check(false); err != nil {
		return 0, err
	}
	if f.off >= int64(len(f.buf)) {
		return 0, io.EOF
	}
	n := copy(p, f.buf[f.off:])
	f.off += int64(n)
	return n, nil
}

// Write writes to the local copy (at the end with O_APPEND); Sync or Close
// sends it.
func (f *SandboxFile) Write(p []byte) (int, error) {
	if err := f.check(true); err != nil {
		return 0, err
	}
	if f.flag&os.O_APPEND != 0 {
		f.off = int64(len(f.buf))
	}
	if end := f.off + int64(len(p)); end > int64(len(f.buf)) {
		f.buf = append(f.buf, make([]byte, end-int64(len(f.buf)))...)
	}
	copy(f.buf[f.off:], p)
	f.off += int64(len(p))
	f.dirty = true
	return len(p), nil
}

// WriteString is Write of a string.
func (f *SandboxFile) WriteString(s string) (int, error) { return f.Write([]byte(s)) }

// Seek sets the offset of the next Read or Write, as io.Seeker.
func (f *SandboxFile) Seek(offset int64, whence int) (int64, error) {
	if f.closed {
		return 0, fmt.Errorf("%s: %w", f.path, os.ErrClosed)
	}
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += f.off
	case io.SeekEnd:
		offset += int64(len(f.buf))
	default:
		return 0, fmt.Errorf("seek %s: bad whence %d", f.path, whence)
	}
	if offset < 0 {
		return 0, fmt.Errorf("seek %s: negative offset %d", f.path, offset)
	}
	f.off = offset
	return offset, nil
}

// Sync sends what was written to the sandbox.
func (f *SandboxFile) Sync(ctx context.Context) error {
	if f.closed {
		return fmt.Errorf("%s: %w", f.path, os.ErrClosed)
	}
	if !f.dirty {
		return nil
	}
	if f.flag&os.O_APPEND != 0 {
		if _, err := f.sb.upload(ctx, f.path, bytes.NewReader(f.buf[f.sent:]), f.perm, true); err != nil {
			return err
		}
		f.sent = len(f.buf)
	} else if _, err := f.sb.upload(ctx, f.path, bytes.NewReader(f.buf), f.perm, false); err != nil {
		return err
	}
	f.dirty = false
	return nil
}

// Close sends what was written (with context.Background(): call Sync with a
// context first to bound it) and closes the file.
func (f *SandboxFile) Close() error {
	if f.closed {
		return fmt.Errorf("%s: %w", f.path, os.ErrClosed)
	}
	err := f.Sync(context.Background())
	f.closed = true
	return err
}

var _ io.ReadWriteSeeker = (*SandboxFile)(nil)
