package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// writeFile uploads data from r in chunks of 1 MiB.
func (a *testAgent) writeFile(t *testing.T, hdr *sbxv1.WriteFileHeader, r io.Reader) (int64, error) {
	t.Helper()
	stream := a.conn.WriteFile(testCtx(t))
	if err := stream.Send(&sbxv1.WriteFileRequest{Msg: &sbxv1.WriteFileRequest_Header{Header: hdr}}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if err := stream.Send(&sbxv1.WriteFileRequest{Msg: &sbxv1.WriteFileRequest_Data{Data: buf[:n]}}); err != nil {
				break // the real error comes from CloseAndReceive
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	resp, err := stream.CloseAndReceive()
	if err != nil {
		return 0, err
	}
	return resp.Msg.GetBytesWritten(), nil
}

// readFile downloads path into w.
func (a *testAgent) readFile(t *testing.T, req *sbxv1.ReadFileRequest, w io.Writer) error {
	t.Helper()
	stream, err := a.conn.ReadFile(testCtx(t), connect.NewRequest(req))
	if err != nil {
		return err
	}
	defer stream.Close()
	for stream.Receive() {
		if n := len(stream.Msg().GetData()); n > fileChunkSize {
			t.Errorf("chunk size: got %d, want <= %d", n, fileChunkSize)
		}
		w.Write(stream.Msg().GetData())
	}
	return stream.Err()
}

func TestWriteReadLargeFile(t *testing.T) {
	a := newTestAgent(t)
	const size = 50 << 20
	src := io.LimitReader(rand.Reader, size)
	sum := sha256.New()
	n, err := a.writeFile(t, &sbxv1.WriteFileHeader{Path: "big.bin"}, io.TeeReader(src, sum))
	if err != nil {
		t.Fatal(err)
	}
	if n != size {
		t.Errorf("bytes written: got %d, want %d", n, size)
	}
	want := sum.Sum(nil)
	got := sha256.New()
	if err := a.readFile(t, &sbxv1.ReadFileRequest{Path: filepath.Join(a.workdir, "big.bin")}, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Sum(nil), want) {
		t.Errorf("checksum of read back file differs")
	}
	fi, err := os.Stat(filepath.Join(a.workdir, "big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fi.Mode().Perm(), os.FileMode(0o644); got != want {
		t.Errorf("mode: got %v, want %v", got, want)
	}
}

func TestWriteFileModes(t *testing.T) {
	a := newTestAgent(t)
	write := func(hdr *sbxv1.WriteFileHeader, data string) error {
		_, err := a.writeFile(t, hdr, bytes.NewReader([]byte(data)))
		return err
	}
	if err := write(&sbxv1.WriteFileHeader{Path: "f.txt", Mode: 0o600}, "one\n"); err != nil {
		t.Fatal(err)
	}
	if err := write(&sbxv1.WriteFileHeader{Path: "f.txt", Append: true}, "two\n"); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(a.workdir, "f.txt"))
	if got, want := string(b), "one\ntwo\n"; got != want {
		t.Errorf("after append: got %q, want %q", got, want)
	}
	fi, _ := os.Stat(filepath.Join(a.workdir, "f.txt"))
	if got, want := fi.Mode().Perm(), os.FileMode(0o600); got != want {
		t.Errorf("mode: got %v, want %v", got, want)
	}

	err := write(&sbxv1.WriteFileHeader{Path: "a/b/c.txt"}, "x")
	if got, want := connect.CodeOf(err), connect.CodeNotFound; got != want {
		t.Errorf("missing parent: got %v (%v), want %v", got, err, want)
	}
	if err := write(&sbxv1.WriteFileHeader{Path: "a/b/c.txt", MakeParents: true}, "x"); err != nil {
		t.Errorf("make_parents: %v", err)
	}
	err = write(&sbxv1.WriteFileHeader{Path: "a"}, "x")
	if got, want := connect.CodeOf(err), connect.CodeInvalidArgument; got != want {
		t.Errorf("write over dir: got %v (%v), want %v", got, err, want)
	}
	ents, _ := os.ReadDir(filepath.Join(a.workdir, "a", "b"))
	if got, want := len(ents), 1; got != want {
		t.Errorf("files in a/b (no temp left): got %d, want %d", got, want)
	}
}

func TestReadFile(t *testing.T) {
	a := newTestAgent(t)
	if err := os.WriteFile(filepath.Join(a.workdir, "f"), []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		req      *sbxv1.ReadFileRequest
		want     string
		wantCode connect.Code
	}{
		{name: "all", req: &sbxv1.ReadFileRequest{Path: "f"}, want: "0123456789"},
		{name: "offset", req: &sbxv1.ReadFileRequest{Path: "f", Offset: 7}, want: "789"},
		{name: "offset length", req: &sbxv1.ReadFileRequest{Path: "f", Offset: 2, Length: 3}, want: "234"},
		{name: "past end", req: &sbxv1.ReadFileRequest{Path: "f", Offset: 20}, want: ""},
		{name: "missing", req: &sbxv1.ReadFileRequest{Path: "nope"}, wantCode: connect.CodeNotFound},
		{name: "directory", req: &sbxv1.ReadFileRequest{Path: "/"}, wantCode: connect.CodeInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			err := a.readFile(t, tt.req, &buf)
			if got := connect.CodeOf(err); err != nil && got != tt.wantCode || err == nil && tt.wantCode != 0 {
				t.Fatalf("error: got %v, want code %v", err, tt.wantCode)
			}
			if got := buf.String(); got != tt.want {
				t.Errorf("data: got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestListDirStatMkdirRemoveRename(t *testing.T) {
	a := newTestAgent(t)
	ctx := testCtx(t)
	wd := a.workdir
	for _, d := range []string{"d/e/f"} {
		os.MkdirAll(filepath.Join(wd, d), 0o755)
	}
	os.WriteFile(filepath.Join(wd, "d/file"), []byte("abc"), 0o640)
	os.WriteFile(filepath.Join(wd, "d/e/f/deep"), nil, 0o644)
	os.Symlink("file", filepath.Join(wd, "d/link"))
	os.Symlink("/", filepath.Join(wd, "d/e/rootlink")) // must not be followed

	list := func(recursive bool, depth int32) []string {
		t.Helper()
		resp, err := a.conn.ListDir(ctx, connect.NewRequest(&sbxv1.ListDirRequest{Path: "d", Recursive: recursive, MaxDepth: depth}))
		if err != nil {
			t.Fatal(err)
		}
		var paths []string
		for _, e := range resp.Msg.GetEntries() {
			rel, _ := filepath.Rel(filepath.Join(wd, "d"), e.GetPath())
			paths = append(paths, rel)
		}
		return paths
	}
	if diff := cmp.Diff([]string{"e", "file", "link"}, list(false, 0)); diff != "" {
		t.Errorf("list (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"e", "e/f", "e/f/deep", "e/rootlink", "file", "link"}, list(true, 0)); diff != "" {
		t.Errorf("list recursive (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"e", "e/f", "e/rootlink", "file", "link"}, list(true, 2)); diff != "" {
		t.Errorf("list depth 2 (-want +got):\n%s", diff)
	}

	os.Symlink("d", filepath.Join(wd, "dlink"))
	resp, err := a.conn.ListDir(ctx, connect.NewRequest(&sbxv1.ListDirRequest{Path: "dlink"}))
	if err != nil {
		t.Fatalf("list through a symlinked directory: %v", err)
	}
	if got, want := len(resp.Msg.GetEntries()), 3; got != want {
		t.Errorf("entries through a symlinked directory: got %d, want %d", got, want)
	} else if got, want := resp.Msg.GetEntries()[0].GetPath(), filepath.Join(wd, "dlink/e"); got != want {
		t.Errorf("path through a symlinked directory: got %q, want %q", got, want)
	}
	_, err = a.conn.ListDir(ctx, connect.NewRequest(&sbxv1.ListDirRequest{Path: "d/file"}))
	if got, want := connect.CodeOf(err), connect.CodeFailedPrecondition; got != want {
		t.Errorf("list a file: got %v, want %v", got, want)
	}

	st, err := a.conn.Stat(ctx, connect.NewRequest(&sbxv1.StatRequest{Path: "d/link"}))
	if err != nil {
		t.Fatal(err)
	}
	info := st.Msg.GetInfo()
	if got, want := info.GetType(), sbxv1.FileType_FILE_TYPE_SYMLINK; got != want {
		t.Errorf("stat type: got %v, want %v", got, want)
	}
	if got, want := info.GetSymlinkTarget(), "file"; got != want {
		t.Errorf("symlink target: got %q, want %q", got, want)
	}
	st, err = a.conn.Stat(ctx, connect.NewRequest(&sbxv1.StatRequest{Path: filepath.Join(wd, "d/file")}))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := st.Msg.GetInfo(), (&sbxv1.FileInfo{Path: filepath.Join(wd, "d/file"), Name: "file", Type: sbxv1.FileType_FILE_TYPE_FILE, Size: 3, Mode: 0o640}); got.GetType() != want.Type || got.GetSize() != want.Size || got.GetMode() != want.Mode || got.GetName() != want.Name || got.GetPath() != want.Path {
		t.Errorf("stat: got %v, want %v", got, want)
	}
	_, err = a.conn.Stat(ctx, connect.NewRequest(&sbxv1.StatRequest{Path: "nope"}))
	if got, want := connect.CodeOf(err), connect.CodeNotFound; got != want {
		t.Errorf("stat missing: got %v, want %v", got, want)
	}

	mkdir := func(p string, parents bool) error {
		_, err := a.conn.MakeDir(ctx, connect.NewRequest(&sbxv1.MakeDirRequest{Path: p, Parents: parents}))
		return err
	}
	if err := mkdir("m", false); err != nil {
		t.Error(err)
	}
	if got, want := connect.CodeOf(mkdir("m", false)), connect.CodeAlreadyExists; got != want {
		t.Errorf("mkdir existing: got %v, want %v", got, want)
	}
	if got, want := connect.CodeOf(mkdir("x/y", false)), connect.CodeNotFound; got != want {
		t.Errorf("mkdir no parent: got %v, want %v", got, want)
	}
	if err := mkdir("x/y", true); err != nil {
		t.Error(err)
	}
	if got, want := connect.CodeOf(mkdir("d/file/sub", true)), connect.CodeFailedPrecondition; got != want {
		t.Errorf("mkdir under file: got %v, want %v", got, want)
	}
	if fi, err := os.Stat(filepath.Join(wd, "x/y")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("mkdir -p: got %v, %v, want a 0755 dir", fi, err)
	}

	rename := func(from, to string) error {
		_, err := a.conn.Rename(ctx, connect.NewRequest(&sbxv1.RenameRequest{From: from, To: to}))
		return err
	}
	if err := rename("d/file", "x/moved"); err != nil {
		t.Error(err)
	}
	if _, err := os.Stat(filepath.Join(wd, "x/moved")); err != nil {
		t.Errorf("after rename: %v", err)
	}
	if got, want := connect.CodeOf(rename("nope", "x/z")), connect.CodeNotFound; got != want {
		t.Errorf("rename missing: got %v, want %v", got, want)
	}

	remove := func(p string, recursive bool) error {
		_, err := a.conn.Remove(ctx, connect.NewRequest(&sbxv1.RemoveRequest{Path: p, Recursive: recursive}))
		return err
	}
	if got, want := connect.CodeOf(remove("d", false)), connect.CodeFailedPrecondition; got != want {
		t.Errorf("remove non-empty: got %v, want %v", got, want)
	}
	if got, want := connect.CodeOf(remove("/", true)), connect.CodeInvalidArgument; got != want {
		t.Errorf("remove /: got %v, want %v", got, want)
	}
	if got, want := connect.CodeOf(remove("/..", true)), connect.CodeInvalidArgument; got != want {
		t.Errorf("remove /..: got %v, want %v", got, want)
	}
	if got, want := connect.CodeOf(remove("nope", true)), connect.CodeNotFound; got != want {
		t.Errorf("remove missing: got %v, want %v", got, want)
	}
	if err := remove("d", true); err != nil {
		t.Error(err)
	}
	if _, err := os.Lstat(filepath.Join(wd, "d")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after remove: got %v, want not exist", err)
	}
	if err := remove("x/moved", false); err != nil {
		t.Error(err)
	}
}
