package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/splice"
)

// rawRead reads a file over a raw file connection.
func (a *testAgent) rawRead(t *testing.T, req *sbxv1.ReadFileRequest) ([]byte, error) {
	t.Helper()
	rr, err := a.conn.ReadFileRaw(testCtx(t), req)
	if err != nil {
		return nil, err
	}
	defer rr.Close()
	b, err := io.ReadAll(rr.Body)
	if err == nil && int64(len(b)) != rr.Size {
		err = io.ErrUnexpectedEOF
	}
	return b, err
}

// TestRawFileRoundTrip writes files over raw file connections (from a
// buffer, and spliced from a socket) and reads them back the same way and
// with ReadFile: byte for byte, sizes 0 to 20 MiB, sparse files, ranges.
func TestRawFileRoundTrip(t *testing.T) {
	a := newTestAgent(t)
	for _, tc := range []struct {
		name   string
		size   int
		socket bool // the data comes from a socket (spliced), not a buffer
	}{
		{"empty", 0, false},
		{"one byte", 1, false},
		{"odd size", 100<<10 + 3, false},
		{"20 MiB", 20 << 20, false},
		{"20 MiB from a socket", 20<<20 + 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := make([]byte, tc.size)
			rand.Read(data)
			var src io.Reader = bytes.NewReader(data)
			if tc.socket {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				go func() {
					c, err := net.Dial("tcp", ln.Addr().String())
					if err == nil {
						c.Write(data)
						c.Close()
					}
				}()
				c, err := ln.Accept()
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				src = c
			}
			name := strings.ReplaceAll(tc.name, " ", "_")
			resp, taken, err := a.conn.WriteFileRaw(testCtx(t), &sbxv1.WriteFileHeader{Path: name, Mode: 0o640}, int64(tc.size), src, nil)
			if err != nil {
				t.Fatalf("WriteFileRaw: %v", err)
			}
			if resp.GetBytesWritten() != int64(tc.size) || taken != int64(tc.size) {
				t.Errorf("bytes written, taken: got %d, %d; want %d", resp.GetBytesWritten(), taken, tc.size)
			}
			on, err := os.ReadFile(filepath.Join(a.workdir, name))
			if err != nil || !bytes.Equal(on, data) {
				t.Fatalf("file on disk: %d bytes, %v; want the %d written", len(on), err, tc.size)
			}
			if fi, _ := os.Stat(filepath.Join(a.workdir, name)); fi.Mode().Perm() != 0o640 {
				t.Errorf("mode: got %v, want 0640", fi.Mode().Perm())
			}
			got, err := a.rawRead(t, &sbxv1.ReadFileRequest{Path: name})
			if tc.size == 0 {
				// No length known up front: the ReadFile stream answers it.
				if !errors.Is(err, errors.ErrUnsupported) {
					t.Errorf("raw read of an empty file: got %v, want errors.ErrUnsupported", err)
				}
				return
			}
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("raw read: %d bytes, %v; want the %d written", len(got), err, tc.size)
			}
		})
	}

	// Sparse: holes read as zeros, as many as the file's size says.
	sparse := filepath.Join(a.workdir, "sparse")
	f, err := os.Create(sparse)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("head"), 0)
	f.WriteAt([]byte("tail"), 64<<20)
	f.Close()
	got, err := a.rawRead(t, &sbxv1.ReadFileRequest{Path: "sparse"})
	want := make([]byte, 64<<20+4)
	copy(want, "head")
	copy(want[64<<20:], "tail")
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("sparse raw read: %d bytes, %v; want %d bytes, head, zeros, tail", len(got), err, len(want))
	}
	for _, r := range []struct {
		off, n int64
		want   string
	}{{1, 2, "ea"}, {64 << 20, 0, "tail"}, {64<<20 + 2, 100, "il"}} {
		got, err := a.rawRead(t, &sbxv1.ReadFileRequest{Path: "sparse", Offset: r.off, Length: r.n})
		if err != nil || string(got) != r.want {
			t.Errorf("range %d+%d: got %q, %v; want %q", r.off, r.n, got, err, r.want)
		}
	}
}

// TestRawFileRefusals: raw file connections refuse what the file RPCs
// refuse, with the same codes, and leave nothing behind.
func TestRawFileRefusals(t *testing.T) {
	a := newTestAgent(t)
	if err := os.Mkdir(filepath.Join(a.workdir, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		hdr  *sbxv1.WriteFileHeader
		want connect.Code
	}{
		{"no path", &sbxv1.WriteFileHeader{}, connect.CodeInvalidArgument},
		{"root", &sbxv1.WriteFileHeader{Path: "/"}, connect.CodeInvalidArgument},
		{"over a directory", &sbxv1.WriteFileHeader{Path: "dir"}, connect.CodeInvalidArgument},
		{"missing parent", &sbxv1.WriteFileHeader{Path: "no/such/file"}, connect.CodeNotFound},
		{"the agent's /proc", &sbxv1.WriteFileHeader{Path: "/proc/self/environ"}, connect.CodePermissionDenied},
	} {
		t.Run("write "+tc.name, func(t *testing.T) {
			read := 0
			src := readerFunc(func(p []byte) (int, error) { read += len(p); return len(p), nil })
			_, _, err := a.conn.WriteFileRaw(testCtx(t), tc.hdr, 1<<20, src, nil)
			if got := connect.CodeOf(err); got != tc.want {
				t.Errorf("got %v (%v), want %v", got, err, tc.want)
			}
			if read != 0 {
				t.Errorf("read %d bytes of a refused write's data, want 0", read)
			}
		})
	}
	for _, tc := range []struct {
		name string
		req  *sbxv1.ReadFileRequest
		want connect.Code
	}{
		{"missing", &sbxv1.ReadFileRequest{Path: "nothing"}, connect.CodeNotFound},
		{"a directory", &sbxv1.ReadFileRequest{Path: "dir"}, connect.CodeInvalidArgument},
		{"negative offset", &sbxv1.ReadFileRequest{Path: "dir", Offset: -1}, connect.CodeInvalidArgument},
		{"procfs (no length)", &sbxv1.ReadFileRequest{Path: "/proc/version"}, connect.CodeUnimplemented},
	} {
		t.Run("read "+tc.name, func(t *testing.T) {
			_, err := a.rawRead(t, tc.req)
			if got := connect.CodeOf(err); got != tc.want {
				t.Errorf("got %v (%v), want %v", got, err, tc.want)
			}
		})
	}
	if ents, _ := os.ReadDir(a.workdir); len(ents) != 1 {
		t.Errorf("work dir after refusals: %d entries, want only dir", len(ents))
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// TestRawFileCutShort: a writer whose data ends early (the client left,
// the daemon closed) leaves neither the file nor a temporary one, and an
// existing file as it was.
func TestRawFileCutShort(t *testing.T) {
	a := newTestAgent(t)
	p := filepath.Join(a.workdir, "f")
	if err := os.WriteFile(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		path string
	}{{"new file", "new"}, {"replacing", "f"}} {
		t.Run(tc.name, func(t *testing.T) {
			src := io.MultiReader(bytes.NewReader(make([]byte, 3<<20)), readerFunc(func([]byte) (int, error) { return 0, io.ErrClosedPipe }))
			_, _, err := a.conn.WriteFileRaw(testCtx(t), &sbxv1.WriteFileHeader{Path: tc.path}, 8<<20, src, nil)
			if !errors.Is(err, splice.ErrSource) {
				t.Fatalf("got %v, want splice.ErrSource", err)
			}
			// The agent notices the connection closing; wait for it to
			// remove the temporary file.
			deadline := time.Now().Add(10 * time.Second)
			for {
				ents, _ := os.ReadDir(a.workdir)
				if len(ents) == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("work dir still holds %d entries, want only f", len(ents))
				}
				time.Sleep(10 * time.Millisecond) // polling a condition the test observes
			}
			if b, _ := os.ReadFile(p); string(b) != "old" {
				t.Errorf("f holds %q, want \"old\"", b)
			}
		})
	}
}

// TestHelperSinkCopyFromDiskFull: data spliced to the file writer whose
// file write fails (ENOSPC, from /dev/full) fails with that errno, not
// with "the helper died".
func TestHelperSinkCopyFromDiskFull(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctl := os.NewFile(uintptr(fds[0]), "ctl")
	defer ctl.Close()
	defer unix.Close(fds[1])
	unix.SetNonblock(fds[1], false)
	go func() {
		buf, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(3*4))
		_, oobn, _, _, err := unix.Recvmsg(fds[1], buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err != nil {
			return
		}
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		got, _ := unix.ParseUnixRights(&msgs[0])
		copyForAgent(got[0], got[1], got[2])
	}()
	dst, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip("no /dev/full:", err)
	}
	defer dst.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := newHelperSink(ctx, ctl, dst, func() bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	broken := true
	s.done = func(b bool) { broken = b }
	w, r := net.Pipe()
	defer r.Close()
	go func() { w.Write(make([]byte, 8<<20)); w.Close() }()
	_, err = s.copyFrom(r, 8<<20)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("copyFrom: got %v, want ENOSPC", err)
	}
	s.abort()
	if broken {
		t.Error("the helper was dropped after it answered ENOSPC, want it kept")
	}
}

// TestBigPipeSizeSharesTheBudget: the pipes raw transfers splice through
// take from the same bigPipes as the file writer's data pipes, and give
// them back.
func TestBigPipeSizeSharesTheBudget(t *testing.T) {
	var dones []func()
	for i := range bigPipes + 1 {
		size, done := bigPipeSize()
		dones = append(dones, done)
		if want := bigPipeBytes; i >= bigPipes {
			want = 0
			if size != want {
				t.Errorf("pipe %d: size %d, want %d (all %d taken)", i, size, want, bigPipes)
			}
		} else if size != want {
			t.Errorf("pipe %d: size %d, want %d", i, size, want)
		}
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	if growPipe(p[1]) {
		t.Error("the file writer grew a data pipe while raw transfers held every big pipe")
	}
	for _, done := range dones {
		done()
	}
	if got := bigPipesInUse.Load(); got != 0 {
		t.Errorf("big pipes in use after all were given back: %d, want 0", got)
	}
}
