package integration

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// hostCanary makes a directory outside the daemon's data dir holding files
// a sandbox must never be able to list, read or remove through the daemon.
func hostCanary(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{
		"victim":                       "host file\n",
		"sub/host-secret-name.txt":     "host secret\n",
		"victimdir/keep-me.txt":        "host data\n",
		"victimdir/deeper/keep-me.txt": "host data\n",
	})
	// Readable by the sandboxes' host uids, as a careless host dir would be.
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil {
			_ = os.Chmod(p, 0o755)
		}
		return nil
	})
	return dir
}

func checkCanary(t *testing.T, dir string) {
	t.Helper()
	for _, p := range []string{"victim", "sub/host-secret-name.txt", "victimdir/keep-me.txt", "victimdir/deeper/keep-me.txt"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Errorf("host canary %s is gone: %v", p, err)
		}
	}
}

func codebaseSandbox(t *testing.T, ctx context.Context, d *daemon, cb string, disk int64) *sbx.Sandbox {
	t.Helper()
	return newBox(t, ctx, d, sbx.CreateOptions{Codebases: []sbx.CodebaseMount{{Codebase: cb}}, DiskBytes: disk})
}

func mustSync(t *testing.T, ctx context.Context, sb *sbx.Sandbox, opts sbx.SyncOptions) []string {
	t.Helper()
	res, err := sb.SyncCodebase(ctx, opts)
	if err != nil {
		t.Fatalf("sync %s: %v", sb.ID, err)
	}
	return append(append(res.GetWritten(), res.GetDeleted()...), conflictPaths(res.GetConflicts())...)
}

func conflictPaths[T interface{ GetPath() string }](cs []T) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.GetPath())
	}
	return out
}

// TestCodebaseSyncNeverFollowsSymlinks is the attack of the trust-boundary
// issue: sandboxes sharing a codebase plant a symlink to a host directory in
// it, and another sandbox's (forced) sync and dry run must neither delete nor
// list anything through it.
func TestCodebaseSyncNeverFollowsSymlinks(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 4*time.Minute)
	c := d.client()
	canary := hostCanary(t)
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a.txt": "a\n"})
	if _, _, code := d.cli("", "codebase", "create", src, "--name", "proj"); code != 0 {
		t.Fatal("codebase create failed")
	}

	// S mounts revision 1 (no d); U adds the empty dir d; S adds d/victim.
	s := codebaseSandbox(t, ctx, d, "proj", 0)
	u := codebaseSandbox(t, ctx, d, "proj", 0)
	mustRun(t, ctx, u, "mkdir /workspace/d")
	mustSync(t, ctx, u, sbx.SyncOptions{})
	mustRun(t, ctx, s, "mkdir -p /workspace/d && echo v > /workspace/d/victim && mkdir /workspace/d/victimdir && echo x > /workspace/d/victimdir/keep-me.txt")
	mustSync(t, ctx, s, sbx.SyncOptions{})
	// T (made later) turns d into a symlink to the host directory and syncs.
	tb := codebaseSandbox(t, ctx, d, "proj", 0)
	mustRun(t, ctx, tb, "rm -rf /workspace/d && ln -s "+canary+" /workspace/d && ln -s / /workspace/x")
	mustSync(t, ctx, tb, sbx.SyncOptions{})
	// S removes d: its vanished paths d/victim... now lie below T's symlink.
	mustRun(t, ctx, s, "rm -rf /workspace/d")
	for _, opts := range []sbx.SyncOptions{{DryRun: true}, {}, {Force: true}} {
		got := mustSync(t, ctx, s, opts)
		for _, p := range got {
			if strings.Contains(p, "keep-me") || strings.Contains(p, "host-secret") {
				t.Errorf("sync %+v of S names a host path: %q", opts, p)
			}
		}
		checkCanary(t, canary)
	}
	// The dry-run leak: V sees x -> / and d -> canary, replaces them with
	// real directories holding plain files where the host has directories.
	v := codebaseSandbox(t, ctx, d, "proj", 0)
	mustRun(t, ctx, v, "rm /workspace/x /workspace/d && mkdir /workspace/x /workspace/d && echo f > /workspace/x/etc && echo f > /workspace/d/sub && echo f > /workspace/d/victimdir")
	for _, opts := range []sbx.SyncOptions{{DryRun: true}, {Force: true}} {
		for _, p := range mustSync(t, ctx, v, opts) {
			if strings.HasPrefix(p, "x/etc/") || strings.HasPrefix(p, "d/sub/") || strings.HasPrefix(p, "d/victimdir/") {
				t.Errorf("sync %+v of V lists a host path: %q", opts, p)
			}
		}
	}
	checkCanary(t, canary)
	files := downloadFiles(t, c, "proj")
	if files["x/etc"] != "f\n" || files["d/sub"] != "f\n" {
		t.Errorf("V's files not synced: %v", files)
	}
	// A new sandbox sees V's real directories, and nothing of the host.
	w := codebaseSandbox(t, ctx, d, "proj", 0)
	if got := mustRun(t, ctx, w, "cat /workspace/x/etc /workspace/d/sub; ls /workspace/d"); got != "f\nf\nsub\nvictimdir\n" {
		t.Errorf("new sandbox sees %q", got)
	}
}

// TestCodebaseSyncSparseAndOddNames: a 2 GiB sparse file made in a 64 MiB
// box does not become 2 GiB on the host; a path deeper than PATH_MAX syncs;
// a name that is not UTF-8 refuses the sync before anything is committed.
func TestCodebaseSyncSparseAndOddNames(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 4*time.Minute)
	c := d.client()
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a.txt": "a\n"})
	if _, _, code := d.cli("", "codebase", "create", src, "--name", "proj"); code != 0 {
		t.Fatal("codebase create failed")
	}
	trees := filepath.Join(d.dataDir, "codebases", "trees")
	before := allocated(t, trees)

	sb := codebaseSandbox(t, ctx, d, "proj", 64<<20)
	// The codebase's overlay names its layers by fd: no host path shows.
	if mi := mustRun(t, ctx, sb, "cat /proc/self/mountinfo"); strings.Contains(mi, d.dataDir) || strings.Contains(mi, sb.ID) {
		t.Errorf("a codebase box's mountinfo shows the data dir or its id:\n%s", mi)
	}
	mustRun(t, ctx, sb, "truncate -s 2G /workspace/sparse && echo data-at-1G | dd of=/workspace/sparse bs=1M seek=1024 conv=notrunc status=none")
	// 25 levels of 200-byte names: about 5 KB, past PATH_MAX.
	mustRun(t, ctx, sb, `python3 -c "
import os
os.chdir('/workspace')
for i in range(25):
    os.mkdir('n'*200); os.chdir('n'*200)
open('f', 'w').write('deep')
"`)
	mustSync(t, ctx, sb, sbx.SyncOptions{})
	if grew := allocated(t, trees) - before; grew > 16<<20 {
		t.Errorf("sync of a 2 GiB sparse file allocated %d MiB on the host", grew>>20)
	} else {
		t.Logf("sync of a 2 GiB sparse file allocated %d KiB on the host", grew>>10)
	}
	other := codebaseSandbox(t, ctx, d, "proj", 0)
	if got := mustRun(t, ctx, other, "stat -c %s /workspace/sparse; dd if=/workspace/sparse bs=1M skip=1024 count=1 status=none | head -c 10"); got != "2147483648\ndata-at-1G" {
		t.Errorf("sparse file in a new sandbox: %q", got)
	}
	if got := mustRun(t, ctx, other, `python3 -c "
import os
os.chdir('/workspace')
for i in range(25):
    os.chdir('n'*200)
print(open('f').read())
"`); got != "deep\n" {
		t.Errorf("deep file in a new sandbox: %q", got)
	}

	// Copied out to the client (a file, and inside a directory) it stays
	// sparse too.
	out := t.TempDir()
	for _, src := range []string{"/workspace/sparse", "/workspace"} {
		dst := filepath.Join(out, strings.ReplaceAll(src, "/", "_"))
		if _, errOut, code := d.cli("", "cp", sb.ID+":"+src, dst); code != 0 {
			t.Fatalf("sbx cp %s: exit %d: %s", src, code, errOut)
		}
	}
	if a := allocated(t, out); a > 16<<20 {
		t.Errorf("sbx cp of a 2 GiB sparse file allocated %d MiB on the client", a>>20)
	}
	cb, err := c.GetCodebase(ctx, "proj")
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, ctx, sb, `touch "$(printf '/workspace/bad\377name')" && echo more > /workspace/more.txt`)
	_, err = sb.SyncCodebase(ctx, sbx.SyncOptions{})
	wantCode(t, "sync of a non-UTF-8 name", err, connect.CodeInvalidArgument)
	if !strings.Contains(err.Error(), "not valid UTF-8") {
		t.Errorf("error does not say why: %v", err)
	}
	if after, _ := c.GetCodebase(ctx, "proj"); after.GetRevision() != cb.GetRevision() {
		t.Errorf("a refused sync committed revision %d (was %d)", after.GetRevision(), cb.GetRevision())
	}
	mustRun(t, ctx, sb, `rm "$(printf '/workspace/bad\377name')"`)
	if got := mustSync(t, ctx, sb, sbx.SyncOptions{}); len(got) != 1 || got[0] != "more.txt" {
		t.Errorf("sync after removing the bad name: %v", got)
	}
	if err := sb.DestroySynced(ctx); err != nil {
		t.Errorf("rm --sync: %v", err)
	}
}

// allocated is the bytes allocated (not the apparent sizes) under dir, as
// du counts them (hard links once; du walks past PATH_MAX).
func allocated(t *testing.T, dir string) int64 {
	t.Helper()
	out, err := exec.Command("du", "-s", "--block-size=1", dir).Output()
	if err != nil {
		t.Fatalf("du %s: %v", dir, err)
	}
	f := strings.Fields(string(out))
	n, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		t.Fatalf("du output %q", out)
	}
	return n
}
