package integration

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestBuildCopyConfined: a recipe is a hostile document, so `sbx build`
// copies only from the build context. Copy sources outside it are refused
// with the step and src named; symlinks are never followed: those pointing
// inside what is copied reach the image as links, those pointing out are
// refused. The daemon extracts a copy tar (from any client) as hostile,
// inside the step's sandbox.
func TestBuildCopyConfined(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	c := d.client()
	base := pushTestImage(t, ctx, d, "test/tools:1", toolImage(t))

	const secret = "HOST-SECRET-not-in-any-context"
	top := t.TempDir()
	ctxDir := filepath.Join(top, "ctx")
	for _, d := range []string{"app/sub", "out"} {
		if err := os.MkdirAll(filepath.Join(ctxDir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for p, body := range map[string]string{"secret.txt": secret, "ctx/app/hello.txt": "hello from the context\n"} {
		if err := os.WriteFile(filepath.Join(top, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{"ctx/etclink": "/etc", "ctx/out/up": "../../secret.txt",
		"ctx/out/abs": filepath.Join(top, "secret.txt"), "ctx/app/sub/hello": "../hello.txt"} {
		if err := os.Symlink(target, filepath.Join(top, link)); err != nil {
			t.Fatal(err)
		}
	}
	write := func(name, steps string) string {
		p := filepath.Join(ctxDir, name)
		if err := os.WriteFile(p, []byte("from: "+base+"\nsteps:\n"+steps), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}

	for _, tc := range []struct{ src, want string }{
		{"../secret.txt", `recipe step 2 (copy): src "../secret.txt": has a ".." component`},
		{"/etc/hostname", `recipe step 2 (copy): src "/etc/hostname": is an absolute path`},
		{"sub/../../secret.txt", `recipe step 2 (copy): src "sub/../../secret.txt": has a ".." component`},
		{"etclink/hostname", `recipe step 2 (copy): src "etclink/hostname": etclink/hostname leads out of the build context`},
		{"etclink", `symlink etclink -> "/etc" points out of what is copied`},
		{"out", `symlink out/abs -> "` + filepath.Join(top, "secret.txt") + `" points out of what is copied`},
		{"out/up", `symlink out/up -> "../../secret.txt" points out of what is copied`},
	} {
		r := write("bad.yaml", "  - run: true\n  - copy: {src: '"+tc.src+"', dest: /stolen}\n")
		_, errOut, code := d.cli("", "build", "-f", r, "-t", "local/stolen:1")
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("build copying %q: exit %d %q; want a refusal containing %q", tc.src, code, errOut, tc.want)
		}
	}
	if _, err := c.Images().Get(ctx, "local/stolen:1"); !sbx.IsNotFound(err) {
		t.Errorf("an image was built from a refused recipe: %v", err)
	}

	// A proper context copy works; a symlink inside it arrives as a link.
	// The recipe sits outside the context and names it with --context.
	other := t.TempDir()
	good := filepath.Join(other, "good.yaml")
	if err := os.WriteFile(good, []byte("from: "+base+"\nsteps:\n  - copy: {src: app, dest: /app}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := d.cli("", "build", "-f", good, "--context", ctxDir, "-t", "local/ctx:1"); code != 0 {
		t.Fatalf("build from the context: exit %d\n%s", code, errOut)
	}
	sb, err := c.Create(ctx, sbx.CreateOptions{Image: "local/ctx:1"})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	got := mustRun(t, ctx, sb, `cat /app/hello.txt; readlink /app/sub/hello; cat /app/sub/hello`)
	want := "hello from the context\n../hello.txt\nhello from the context\n"
	if got != want {
		t.Errorf("in the built image: got %q, want %q", got, want)
	}
	if strings.Contains(got, secret) {
		t.Error("the host's secret reached the image")
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}

	// Without --context the recipe's own directory is the context, and the
	// same src is missing there.
	if _, errOut, code := d.cli("", "build", "-f", good, "-t", "local/ctx:2"); code == 0 || !strings.Contains(errOut, `src "app" in build context `+other) {
		t.Errorf("build without --context: exit %d %q; want src \"app\" missing from %s", code, errOut, other)
	}

	// Any client may send a copy tar: the daemon has it extracted as
	// hostile inside the step's sandbox, so an entry climbing out is refused
	// and nothing reaches the host.
	escape := filepath.Join(top, "escaped-from-build")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	name := strings.Repeat("../", 20) + strings.TrimPrefix(escape, "/")
	tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: 2})
	tw.Write([]byte("x\n"))
	tw.Close()
	r := &sbxv1.Recipe{From: base, Steps: []*sbxv1.RecipeStep{{Step: &sbxv1.RecipeStep_Copy{Copy: &sbxv1.CopyStep{Dest: "/in", Tar: buf.Bytes()}}}}}
	if _, err := c.Images().Build(ctx, r, "local/escape:1", false, nil); err == nil || !strings.Contains(err.Error(), "step 1 (copy)") {
		t.Errorf("build with a tar entry climbing out: %v; want the copy step refused", err)
	}
	if _, err := os.Lstat(escape); err == nil {
		t.Errorf("%s exists on the host", escape)
	}
	d.assertNoLeaks()
}
