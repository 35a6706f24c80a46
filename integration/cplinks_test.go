package integration

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestCpChainOfLinks: a box makes a tree whose links are each inside it on
// their own — l -> s/x/.. reads as "s" — but together lead out: s/x -> ..
// makes l the destination's parent. `sbx cp` out of the box must not make
// l (it is listed in the warning), and must keep the harmless s/x.
func TestCpChainOfLinks(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	sb, err := d.client().Create(ctx, sbx.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	mustRun(t, ctx, sb, "mkdir -p /tmp/chain/s && cd /tmp/chain && ln -s s/x/.. l && ln -s .. s/x && echo ok > f")

	dst := filepath.Join(t.TempDir(), "dst")
	_, errOut, code := d.cli("", "cp", sb.ID+":/tmp/chain", dst)
	if code != 0 {
		t.Fatalf("sbx cp: exit %d: %s", code, errOut)
	}
	if !strings.Contains(errOut, "l -> s/x/..") {
		t.Errorf("warning: got %q, want it to name l -> s/x/..", errOut)
	}
	if _, err := os.Lstat(filepath.Join(dst, "l")); !os.IsNotExist(err) {
		target, _ := filepath.EvalSymlinks(filepath.Join(dst, "l"))
		t.Errorf("l: got %v (resolving to %q), want it not made", err, target)
	}
	if target, err := os.Readlink(filepath.Join(dst, "s", "x")); err != nil || target != ".." {
		t.Errorf("s/x: got %q, %v, want the in-tree link kept", target, err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "f")); err != nil || string(b) != "ok\n" {
		t.Errorf("f: got %q, %v, want ok", b, err)
	}
}

// TestUploadTarChainOfLinks: an upload (what `sbx cp` to a box, upload_dir
// and a build's COPY send) holds l -> s/x/.. and s/x -> .., each inside the
// destination alone, the destination's parent together. The box's agent
// must refuse the upload naming l and leave no l behind, in either order
// of the two entries.
func TestUploadTarChainOfLinks(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	sb, err := d.client().Create(ctx, sbx.CreateOptions{Command: []string{"sleep", "600"}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	for i, order := range [][2][2]string{
		{{"l", "s/x/.."}, {"s/x", ".."}},
		{{"s/x", ".."}, {"l", "s/x/.."}},
	} {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, e := range order {
			if err := tw.WriteHeader(&tar.Header{Name: e[0], Linkname: e[1], Typeflag: tar.TypeSymlink, Mode: 0o777}); err != nil {
				t.Fatal(err)
			}
		}
		tw.Close()
		dir := fmt.Sprintf("/tmp/up%d", i)
		_, err := sb.UploadTar(ctx, dir, &b)
		if err == nil || !strings.Contains(err.Error(), `"l"`) {
			t.Errorf("order %d: upload: got error %v, want one naming l", i, err)
		}
		res, err := sb.RunShell(ctx, fmt.Sprintf("if [ -L %s/l ]; then echo made; readlink -f %s/l; else echo absent; fi", dir, dir))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(res.Stdout)); got != "absent" {
			t.Errorf("order %d: %s/l: got %q, want absent", i, dir, got)
		}
	}
}
