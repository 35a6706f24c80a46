package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"golang.org/x/sys/unix"
)

// The test process plays the agent: it holds an fd on a "hidden" tree (as
// permfs holds the backing tree of a guard) and its own environ, mem and
// stdout. Links planted in the workdir (as user code would) must not let
// any file API call read, change or remove what only those handles reach.

const hiddenSecret = "SECRET=hunter2-fd"

// hiddenTree makes a directory with .env (secret) and ro.txt, holds an fd
// on it like permfs does and returns the directory.
func hiddenTree(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "hidden")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, ".env"), []byte(hiddenSecret+"\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "ro.txt"), []byte("original\n"), 0o444)
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return dir
}

// agentFDs lists the test process's open fds (the "agent's").
func agentFDs(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var fds []string
	for _, e := range ents {
		fds = append(fds, e.Name())
	}
	return fds
}

// otherTask returns the id of a thread of this process other than its
// main one (the agent's threads are the agent too).
func otherTask(t *testing.T) string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != strconv.Itoa(os.Getpid()) {
			return e.Name()
		}
	}
	t.Skip("the test process has a single thread")
	return ""
}

// leaks reports whether b holds something only the agent's handles reach.
func leaks(b []byte) bool {
	return bytes.Contains(b, []byte(hiddenSecret)) || bytes.Contains(b, []byte("PATH=/")) // the environ
}

func TestFilesRefuseAgentLinks(t *testing.T) {
	a := newTestAgent(t)
	hidden := hiddenTree(t)
	pid := strconv.Itoa(os.Getpid())
	tid := otherTask(t)
	ctx := testCtx(t)

	// Link targets through the agent's magic links and /proc directory.
	targets := map[string]string{
		"environ":             "/proc/" + pid + "/environ",
		"self-environ":        "/proc/self/environ",
		"thread-self-environ": "/proc/thread-self/environ",
		"task-environ":        "/proc/" + tid + "/environ",
		"mem":                 "/proc/self/mem",
		"fd1":                 "/proc/" + pid + "/fd/1",
		"root":                "/proc/" + pid + "/root" + hidden + "/.env",
		"self-root":           "/proc/self/root" + hidden + "/.env",
		"cwd":                 "/proc/" + pid + "/cwd",
	}
	fds := agentFDs(t)
	for _, fd := range fds {
		targets["fd"+fd] = "/proc/" + pid + "/fd/" + fd + "/.env"
		targets["selffd"+fd] = "/proc/self/fd/" + fd + "/.env"
		targets["dir-fd"+fd] = "/proc/" + pid + "/fd/" + fd
	}
	for name, target := range targets {
		if err := os.Symlink(target, filepath.Join(a.workdir, name)); err != nil {
			t.Fatal(err)
		}
	}
	// A plain symlink to a link to a magic link.
	os.Symlink("dir-fd3", filepath.Join(a.workdir, "indirect"))

	read := func(p string) ([]byte, error) {
		var buf bytes.Buffer
		err := a.readFile(t, &sbxv1.ReadFileRequest{Path: p, Length: 1 << 20}, &buf)
		return buf.Bytes(), err
	}
	for name, target := range targets {
		// Through the planted link, and by the target's own path.
		for _, p := range []string{name, target} {
			b, err := read(p)
			if err == nil || leaks(b) {
				t.Errorf("read %s: got %d bytes (leak %v), err %v; want an error", p, len(b), leaks(b), err)
			}
		}
	}
	for _, fd := range fds {
		dir := "dir-fd" + fd
		for _, p := range []string{dir + "/.env", dir + "/ro.txt", "indirect/.env", "/proc/self/fd/" + fd + "/.env"} {
			if b, err := read(p); err == nil || leaks(b) {
				t.Errorf("read %s: got %q, err %v; want an error", p, b, err)
			}
			if _, err := a.conn.Stat(ctx, connect.NewRequest(&sbxv1.StatRequest{Path: p})); err == nil {
				t.Errorf("stat %s: succeeded, want an error", p)
			}
		}
		if _, err := a.writeFile(t, &sbxv1.WriteFileHeader{Path: dir + "/ro.txt"}, strings.NewReader("pwned")); err == nil {
			t.Errorf("write %s/ro.txt: succeeded", dir)
		}
		if _, err := a.writeFile(t, &sbxv1.WriteFileHeader{Path: dir + "/ro.txt", Append: true}, strings.NewReader("pwned")); err == nil {
			t.Errorf("append %s/ro.txt: succeeded", dir)
		}
		if _, err := a.writeFile(t, &sbxv1.WriteFileHeader{Path: dir + "/new", MakeParents: true}, strings.NewReader("x")); err == nil {
			t.Errorf("write %s/new: succeeded", dir)
		}
		resp, err := a.conn.ListDir(ctx, connect.NewRequest(&sbxv1.ListDirRequest{Path: dir, Recursive: true}))
		if err == nil {
			t.Errorf("list %s: got %d entries, want an error", dir, len(resp.Msg.GetEntries()))
		}
		if _, err := a.conn.MakeDir(ctx, connect.NewRequest(&sbxv1.MakeDirRequest{Path: dir + "/made", Parents: true})); err == nil {
			t.Errorf("mkdir %s/made: succeeded", dir)
		}
		if _, err := a.conn.Rename(ctx, connect.NewRequest(&sbxv1.RenameRequest{From: dir + "/.env", To: "stolen"})); err == nil {
			t.Errorf("rename %s/.env: succeeded", dir)
		}
		for _, rec := range []bool{false, true} {
			if _, err := a.conn.Remove(ctx, connect.NewRequest(&sbxv1.RemoveRequest{Path: dir + "/.env", Recursive: rec})); err == nil {
				t.Errorf("remove %s/.env (recursive %v): succeeded", dir, rec)
			}
		}
		if _, err := a.uploadTar(t, dir+"/up", makeTar(t, tarEntry{hdr: tar.Header{Name: "f", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg}, data: "x"})); err == nil {
			t.Errorf("upload tar to %s/up: succeeded", dir)
		}
		// The link itself is archived as a link; what is below it is not.
		if b := a.downloadTar(t, dir); leaks(b) || len(tarNames(t, b)) != 1 {
			t.Errorf("download tar of %s: got entries %v (leak %v), want the symlink alone", dir, tarNames(t, b), leaks(b))
		}
		if b, err := a.tryDownloadTar(dir + "/sub"); err == nil || leaks(b) {
			t.Errorf("download tar of %s/sub: got %v (leak %v), want an error", dir, tarNames(t, b), leaks(b))
		}
	}
	// Downloading and listing the workdir archive the links as links.
	if b := a.downloadTar(t, a.workdir); leaks(b) {
		t.Error("download tar of the workdir holds the hidden content")
	}
	// Listing /proc leaves the agent's directories out.
	resp, err := a.conn.ListDir(ctx, connect.NewRequest(&sbxv1.ListDirRequest{Path: "/proc"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range resp.Msg.GetEntries() {
		if n := e.GetName(); n == pid || n == tid {
			t.Errorf("list /proc shows the agent's own /proc/%s", n)
		}
	}

	// The hidden tree is unchanged.
	if b, err := os.ReadFile(filepath.Join(hidden, ".env")); err != nil || string(b) != hiddenSecret+"\n" {
		t.Errorf("hidden .env after the attacks: got %q, %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(hidden, "ro.txt")); err != nil || string(b) != "original\n" {
		t.Errorf("ro.txt after the attacks: got %q, %v", b, err)
	}
	ents, _ := os.ReadDir(hidden)
	if len(ents) != 3 {
		t.Errorf("hidden tree after the attacks has %d entries, want 3 (.env, ro.txt, sub)", len(ents))
	}
}

// tryDownloadTar downloads p's tar, returning the stream's error.
func (a *testAgent) tryDownloadTar(p string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := a.conn.DownloadTar(ctx, connect.NewRequest(&sbxv1.DownloadTarRequest{Path: p}))
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	for stream.Receive() {
		buf.Write(stream.Msg().GetData())
	}
	return buf.Bytes(), stream.Err()
}

// tarNames lists an archive's entry names.
func tarNames(t *testing.T, b []byte) []string {
	t.Helper()
	var names []string
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		hdr, err := tr.Next()
		if err != nil {
			if err != io.EOF {
				t.Errorf("reading tar: %v", err)
			}
			return names
		}
		names = append(names, hdr.Name)
	}
}

// TestFilesProcNet: the network namespace's tables stay readable (the
// daemon's port listing reads /proc/net/tcp, which is /proc/self/net/tcp).
func TestFilesProcNet(t *testing.T) {
	a := newTestAgent(t)
	var buf bytes.Buffer
	if err := a.readFile(t, &sbxv1.ReadFileRequest{Path: "/proc/net/tcp"}, &buf); err != nil {
		t.Fatalf("read /proc/net/tcp: %v", err)
	}
	if !strings.Contains(buf.String(), "local_address") {
		t.Errorf("/proc/net/tcp: got %q, want the TCP table", buf.String())
	}
	// Someone else's /proc entries are user code's to read too.
	buf.Reset()
	if err := a.readFile(t, &sbxv1.ReadFileRequest{Path: "/proc/cpuinfo"}, &buf); err != nil || buf.Len() == 0 {
		t.Errorf("read /proc/cpuinfo: %d bytes, %v", buf.Len(), err)
	}
}

func TestCheckProcPath(t *testing.T) {
	pid := strconv.Itoa(os.Getpid())
	tests := []struct {
		path string
		want error
	}{
		{"/proc", nil},
		{"/proc/cpuinfo", nil},
		{"/proc/sys/kernel/hostname", nil},
		{"/proc/" + pid + "/net/tcp", nil},
		{"/proc/" + pid + "/net", nil},
		{"/proc/" + pid, errAgentProc},
		{"/proc/" + pid + "/environ", errAgentProc},
		{"/proc/" + pid + "/task/" + pid + "/environ", errAgentProc},
		{"/proc/" + pid + "/netx", errAgentProc},
		{"/proc/" + pid + "/task/" + pid + "/net/tcp", errAgentProc},
		{"/proc/999999999/environ", nil},
		{"/elsewhere/1/environ", errProcElsewhere},
	}
	for _, tt := range tests {
		if got := checkProcPath(tt.path); !errors.Is(got, tt.want) {
			t.Errorf("checkProcPath(%q): got %v, want %v", tt.path, got, tt.want)
		}
	}
}

// TestReadFileNoFIFOBlock: a FIFO is refused on the handle, without
// blocking, whatever the path looked like before.
func TestReadFileNoFIFOBlock(t *testing.T) {
	a := newTestAgent(t)
	if err := unix.Mkfifo(filepath.Join(a.workdir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Symlink("fifo", filepath.Join(a.workdir, "tofifo"))
	for _, p := range []string{"fifo", "tofifo"} {
		err := a.readFile(t, &sbxv1.ReadFileRequest{Path: p}, io.Discard)
		if got, want := connect.CodeOf(err), connect.CodeInvalidArgument; got != want {
			t.Errorf("read %s: got %v (%v), want %v", p, got, err, want)
		}
		_, err = a.writeFile(t, &sbxv1.WriteFileHeader{Path: p, Append: true}, strings.NewReader("x"))
		if got, want := connect.CodeOf(err), connect.CodeInvalidArgument; got != want {
			t.Errorf("append %s: got %v (%v), want %v", p, got, err, want)
		}
	}
}
