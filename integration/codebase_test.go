package integration

import (
	"archive/tar"
	"bytes"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, body := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func tarFiles(t *testing.T, data []byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			b, _ := io.ReadAll(tr)
			out[h.Name] = string(b)
		}
	}
}

func downloadFiles(t *testing.T, c *sbx.Client, ref string) map[string]string {
	t.Helper()
	var buf bytes.Buffer
	if err := c.DownloadCodebase(ctxT(t, time.Minute), ref, &buf); err != nil {
		t.Fatal(err)
	}
	return tarFiles(t, buf.Bytes())
}

// TestCodebases: upload with ignores and a skipped report (CLI), two
// sandboxes with their own layers, sync back, a conflicting sync reported
// with nothing overwritten, delete refused while mounted, rm --sync refused
// on conflict, a daemon kill -9 and restart with mounted codebases, and no
// leaks after destroy.
func TestCodebases(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 4*time.Minute)
	c := d.client()
	src := t.TempDir()
	writeTree(t, src, map[string]string{
		".gitignore":          "*.log\nnode_modules/\n",
		".sandboxignore":      "secret.txt\n",
		"main.py":             "print('v1')\n",
		"lib/util.py":         "X = 1\n",
		"debug.log":           "noise",
		"node_modules/m/i.js": "x",
		"secret.txt":          "hunter2",
		"scratch.tmp":         "tmp",
		"big.bin":             strings.Repeat("b", 4096),
	})
	out, errOut, code := d.cli("", "codebase", "create", src, "--name", "proj", "--ignore", "*.tmp", "--max-file-size", "1K")
	if code != 0 {
		t.Fatalf("codebase create: exit %d: %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	if !strings.HasPrefix(id, "cb-") {
		t.Fatalf("codebase create printed %q", out)
	}
	if !strings.Contains(errOut, "big.bin") || !strings.Contains(errOut, "larger than 1024 bytes") {
		t.Errorf("skipped report: %q", errOut)
	}
	cb, err := c.GetCodebase(ctx, "proj")
	if err != nil {
		t.Fatal(err)
	}
	if cb.GetId() != id || cb.GetFileCount() != 4 || cb.GetRevision() != 1 {
		t.Errorf("inspect: got %v, want 4 files (.gitignore, .sandboxignore, main.py, lib/util.py)", cb)
	}
	files := downloadFiles(t, c, "proj")
	for _, p := range []string{"debug.log", "node_modules/m/i.js", "secret.txt", "scratch.tmp", "big.bin"} {
		if _, ok := files[p]; ok {
			t.Errorf("%s was uploaded", p)
		}
	}
	if files["main.py"] != "print('v1')\n" {
		t.Errorf("main.py: %q", files["main.py"])
	}
	ls, _, code := d.cli("", "codebase", "ls")
	if code != 0 || !strings.Contains(ls, id) || !strings.Contains(ls, "proj") {
		t.Errorf("codebase ls: %q", ls)
	}

	_, err = c.Create(ctx, sbx.CreateOptions{Codebases: []sbx.CodebaseMount{{Codebase: "nope"}}})
	wantCode(t, "unknown codebase", err, connect.CodeNotFound)
	_, err = c.Create(ctx, sbx.CreateOptions{Codebases: []sbx.CodebaseMount{{Codebase: "proj", Path: "/proc/x"}}})
	wantCode(t, "bad mount path", err, connect.CodeInvalidArgument)

	a, err := c.Create(ctx, sbx.CreateOptions{Codebases: []sbx.CodebaseMount{{Codebase: "proj"}}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(a.ID)
	bOut, bErr, code := d.cli("", "create", "--codebase", "proj:/src")
	if code != 0 {
		t.Fatalf("create --codebase: exit %d: %s", code, bErr)
	}
	b, err := c.Get(ctx, strings.TrimSpace(bOut))
	if err != nil {
		t.Fatal(err)
	}
	d.remember(b.ID)
	if got := b.Info.GetCodebases(); len(got) != 1 || got[0].GetPath() != "/src" {
		t.Errorf("sandbox codebases: %v", got)
	}
	// Owned by the sandbox's root; writable.
	if got := mustRun(t, ctx, a, "stat -c %u:%g /workspace/main.py /workspace && cat /workspace/main.py"); got != "0:0\n0:0\nprint('v1')\n" {
		t.Errorf("in A: %q", got)
	}
	mustRun(t, ctx, a, "echo \"print('from A')\" > /workspace/main.py && echo new > /workspace/lib/new.py && rm /workspace/.sandboxignore")
	if got := mustRun(t, ctx, b, "cat /src/main.py; ls /src/lib"); got != "print('v1')\nutil.py\n" {
		t.Errorf("B sees A's layer: %q", got)
	}

	syncOut, syncErr, code := d.cli("", "codebase", "sync", a.ID)
	if code != 0 {
		t.Fatalf("codebase sync A: exit %d: %s", code, syncErr)
	}
	for _, want := range []string{"wrote main.py", "wrote lib/new.py", "wrote delete .sandboxignore"} {
		if !strings.Contains(syncOut, want) {
			t.Errorf("sync output %q lacks %q", syncOut, want)
		}
	}
	files = downloadFiles(t, c, "proj")
	if files["main.py"] != "print('from A')\n" || files["lib/new.py"] != "new\n" {
		t.Errorf("after sync: %v", files)
	}
	if _, ok := files[".sandboxignore"]; ok {
		t.Errorf("after sync: .sandboxignore still there")
	}
	if cb, _ := c.GetCodebase(ctx, "proj"); cb.GetRevision() != 2 {
		t.Errorf("revision after sync: %d", cb.GetRevision())
	}
	// A keeps running and syncing again reports nothing.
	if res, err := a.SyncCodebase(ctx, sbx.SyncOptions{}); err != nil || len(res.GetWritten())+len(res.GetConflicts()) != 0 {
		t.Errorf("second sync of A: %v %v", res, err)
	}

	// B edits the same file: a conflict, reported, nothing written.
	mustRun(t, ctx, b, "echo \"print('from B')\" > /src/main.py && echo b > /src/b.txt")
	_, conflictErr, code := d.cli("", "codebase", "sync", b.ID, "--path", "/src")
	if code == 0 || !strings.Contains(conflictErr, "conflict: main.py") {
		t.Errorf("conflicting sync: exit %d, stderr %q", code, conflictErr)
	}
	files = downloadFiles(t, c, "proj")
	if files["main.py"] != "print('from A')\n" {
		t.Errorf("conflict overwrote main.py: %q", files["main.py"])
	}
	if _, ok := files["b.txt"]; ok {
		t.Errorf("a refused sync wrote b.txt")
	}
	// rm --sync is refused on the conflict; B lives on.
	_, rmErr, code := d.cli("", "rm", "--sync", b.ID)
	if code == 0 || !strings.Contains(rmErr, "main.py") {
		t.Errorf("rm --sync with a conflict: exit %d, stderr %q", code, rmErr)
	}
	if got := mustRun(t, ctx, b, "cat /src/b.txt"); got != "b\n" {
		t.Errorf("B after refused rm --sync: %q", got)
	}

	// Delete is refused while mounted.
	err = c.DeleteCodebase(ctx, "proj")
	wantCode(t, "delete while mounted", err, connect.CodeFailedPrecondition)

	// The daemon dies hard and comes back: mounts keep working.
	d.kill9()
	d.start()
	mustRun(t, ctx, a, "echo after-restart > /workspace/restart.txt")
	if res, err := a.SyncCodebase(ctx, sbx.SyncOptions{}); err != nil || !slices.Contains(res.GetWritten(), "restart.txt") {
		t.Errorf("sync after restart: %v %v", res, err)
	}
	if files = downloadFiles(t, c, "proj"); files["restart.txt"] != "after-restart\n" {
		t.Errorf("after restart sync: %v", files)
	}
	// A destroy with sync writes A's last changes and goes.
	mustRun(t, ctx, a, "echo last > /workspace/last.txt")
	if err := a.DestroySynced(ctx); err != nil {
		t.Fatal(err)
	}
	if files = downloadFiles(t, c, "proj"); files["last.txt"] != "last\n" {
		t.Errorf("after rm --sync: last.txt %q", files["last.txt"])
	}
	// Forced, B wins.
	res, err := b.SyncCodebase(ctx, sbx.SyncOptions{Force: true})
	if err != nil || len(res.GetConflicts()) != 1 {
		t.Fatalf("forced sync: %v %v", res, err)
	}
	if files = downloadFiles(t, c, "proj"); files["main.py"] != "print('from B')\n" || files["b.txt"] != "b\n" {
		t.Errorf("after forced sync: %v", files)
	}
	if err := b.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	d.assertNoLeaks()
	if _, _, code := d.cli("", "codebase", "rm", "proj"); code != 0 {
		t.Errorf("codebase rm after destroy: exit %d", code)
	}
	if ents, _ := os.ReadDir(filepath.Join(d.dataDir, "codebases", "trees")); len(ents) != 0 {
		t.Errorf("codebase trees left: %v", ents)
	}
	if ents, _ := os.ReadDir(filepath.Join(d.dataDir, "codebases", "mounts")); len(ents) != 0 {
		t.Errorf("codebase mount dirs left: %v", ents)
	}
}

// TestCodebaseHostileUpload sends tars a client of ours would never make.
func TestCodebaseHostileUpload(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, time.Minute)
	api := sbxv1connect.NewCodebaseServiceClient(newH2CClient(), "http://"+d.addr, connect.WithGRPC())
	mk := func(hdrs ...*tar.Header) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hdrs {
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			if h.Typeflag == tar.TypeReg && h.Size > 0 {
				_, _ = tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
			}
		}
		_ = tw.Close()
		return buf.Bytes()
	}
	cases := map[string][]byte{
		"dotdot":         mk(&tar.Header{Name: "../../../etc/evil", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1}),
		"symlink escape": mk(&tar.Header{Name: "d", Typeflag: tar.TypeSymlink, Linkname: "/etc"}, &tar.Header{Name: "d/evil", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1}),
		"garbage":        bytes.Repeat([]byte("not a tar "), 100),
	}
	// A fine entry, but the stream stops without the end-of-archive
	// marker: a client whose packing failed closed its request (taken for
	// the whole tree, a codebase of what came, on the old code).
	cut := mk(&tar.Header{Name: "fine", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	cases["cut short"] = cut[:len(cut)-1024]
	for name, data := range cases {
		stream := api.CreateCodebase(ctx)
		_ = stream.Send(&sbxv1.CreateCodebaseRequest{Msg: &sbxv1.CreateCodebaseRequest_Header{Header: &sbxv1.CreateCodebaseHeader{Name: "evil"}}})
		_ = stream.Send(&sbxv1.CreateCodebaseRequest{Msg: &sbxv1.CreateCodebaseRequest_Data{Data: data}})
		_, err := stream.CloseAndReceive()
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("%s: got %v, want invalid argument", name, err)
		}
	}
	if _, err := os.Stat("/etc/evil"); err == nil {
		t.Fatal("/etc/evil was written")
	}
	if cbs, err := d.client().ListCodebases(ctx); err != nil || len(cbs) != 0 {
		t.Errorf("codebases after hostile uploads: %v %v", cbs, err)
	}
}

// newH2CClient speaks HTTP/2 without TLS (what gRPC to the daemon needs).
func newH2CClient() *http.Client {
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: &protos}}
}

// TestCodebaseGitStatus: a git repository uploaded as a codebase is a
// working repository in the sandbox (.git uploaded, files owned by the
// sandbox's root so git trusts the directory).
func TestCodebaseGitStatus(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed (scripts/install-deps.sh installs it)")
	}
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	c := d.client()
	src := t.TempDir()
	writeTree(t, src, map[string]string{"README": "hi\n", "src/a.go": "package a\n", ".gitignore": "*.o\n"})
	for _, args := range [][]string{{"init", "-q"}, {"add", "-A"}, {"commit", "-q", "-m", "init"}} {
		cmd := exec.Command("git", append([]string{"-C", src, "-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
	}
	if _, err := c.CreateCodebase(ctx, src, sbx.UploadOptions{Name: "repo"}); err != nil {
		t.Fatal(err)
	}
	sb, err := c.Create(ctx, sbx.CreateOptions{Codebases: []sbx.CodebaseMount{{Codebase: "repo"}}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	if got := mustRun(t, ctx, sb, "cd /workspace && git status --porcelain && git log --format=%s"); got != "init\n" {
		t.Errorf("clean repo in the sandbox: got %q, want only the log line", got)
	}
	if got := mustRun(t, ctx, sb, "cd /workspace && echo more >> README && touch x.o && git status --porcelain"); got != " M README\n" {
		t.Errorf("modified repo in the sandbox: got %q", got)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	d.assertNoLeaks()
}

// TestGuardedCodebase: a codebase mounted with the agent-safe preset. The
// sandbox's processes see secrets nowhere, the sources read-only and
// /output writable; a sync writes back what the sandbox could write, and the
// hidden files of the codebase are untouched by it.
func TestGuardedCodebase(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	c := d.client()
	src := t.TempDir()
	writeTree(t, src, map[string]string{
		".env": "TOKEN=hunter2\n", "secrets/key.txt": "k\n", "src/app.py": "print('app')\n",
		"id.pem": "pem\n", "output/.keep": "",
	})
	if _, err := c.CreateCodebase(ctx, src, sbx.UploadOptions{Name: "guarded"}); err != nil {
		t.Fatal(err)
	}
	sb, err := c.Create(ctx, sbx.CreateOptions{Codebases: []sbx.CodebaseMount{{
		Codebase: "guarded", Preset: "agent-safe",
		Rules: []sbx.PermissionRule{{Pattern: "/src/generated", Type: sbx.Directory, Permission: sbx.PermWrite, Priority: 20}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	got := mustRun(t, ctx, sb, `cd /workspace
ls -A | sort | tr '\n' ' '; echo
cat .env 2>&1 | sed 's/.*: //'; cat secrets/key.txt 2>&1 | sed 's/.*: //'; cat id.pem 2>&1 | sed 's/.*: //'
python3 src/app.py
{ echo x >> src/app.py; } 2>&1 | sed 's/.*: //'
mkdir -p src/generated && echo gen > src/generated/g.txt && echo generated-ok
echo result > output/result.txt && echo output-ok`)
	want := "output src \n" +
		"No such file or directory\nNo such file or directory\nNo such file or directory\n" +
		"app\nPermission denied\ngenerated-ok\noutput-ok\n"
	if got != want {
		t.Errorf("in the guarded codebase:\ngot  %q\nwant %q", got, want)
	}
	info, err := c.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if pp := info.Info.GetPathPolicies(); len(pp) != 1 || pp[0].GetPath() != "/workspace" || pp[0].GetPreset() != "agent-safe" {
		t.Errorf("path policies of the sandbox: %v, want agent-safe at /workspace", pp)
	}
	res, err := sb.SyncCodebase(ctx, sbx.SyncOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.GetConflicts()) != 0 || !slices.Contains(res.GetWritten(), "output/result.txt") || !slices.Contains(res.GetWritten(), "src/generated/g.txt") {
		t.Errorf("sync: %v, want output/result.txt and src/generated/g.txt written", res)
	}
	// A new sandbox on the synced codebase, unguarded, sees the hidden files
	// unchanged and the written ones.
	sb2, err := c.Create(ctx, sbx.CreateOptions{Codebases: []sbx.CodebaseMount{{Codebase: "guarded"}}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb2.ID)
	if got := mustRun(t, ctx, sb2, "cd /workspace && cat .env output/result.txt src/generated/g.txt src/app.py"); got != "TOKEN=hunter2\nresult\ngen\nprint('app')\n" {
		t.Errorf("after sync, unguarded: got %q", got)
	}
	for _, s := range []*sbx.Sandbox{sb, sb2} {
		if err := s.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	d.assertNoLeaks()
}
