package integration

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// tarLayer builds a layer from entries: a value starting with "->" is a
// symlink, "<host:PATH>" copies a host file, anything else is file content.
func tarLayer(t *testing.T, entries [][2]string) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		name, val := e[0], e[1]
		hdr := &tar.Header{Name: name, Mode: 0o644, ModTime: time.Unix(1700000000, 0)}
		var body []byte
		switch {
		case strings.HasSuffix(name, "/"):
			hdr.Typeflag, hdr.Mode = tar.TypeDir, 0o755
			if val == "1777" {
				hdr.Mode = 0o1777
			}
		case strings.HasPrefix(val, "->"):
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, strings.TrimPrefix(val, "->")
		case strings.HasPrefix(val, "<host:"):
			b, err := os.ReadFile(strings.TrimSuffix(strings.TrimPrefix(val, "<host:"), ">"))
			if err != nil {
				t.Fatal(err)
			}
			hdr.Typeflag, hdr.Mode, body = tar.TypeReg, 0o755, b
		default:
			hdr.Typeflag, body = tar.TypeReg, []byte(val)
		}
		hdr.Size = int64(len(body))
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	tw.Close()
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// tinyImage is a two-layer image made of the host's dash and cat and
// their libraries, with a whiteout in the top layer.
func tinyImage(t *testing.T) v1.Image {
	t.Helper()
	libc, _ := filepath.EvalSymlinks("/lib/x86_64-linux-gnu/libc.so.6")
	ld, _ := filepath.EvalSymlinks("/lib64/ld-linux-x86-64.so.2")
	base := tarLayer(t, [][2]string{
		{"bin", "->usr/bin"}, {"lib", "->usr/lib"}, {"lib64", "->usr/lib64"},
		{"usr/", ""}, {"usr/bin/", ""}, {"usr/lib/", ""}, {"usr/lib/x86_64-linux-gnu/", ""}, {"usr/lib64/", ""},
		{"usr/bin/dash", "<host:/usr/bin/dash>"}, {"usr/bin/sh", "->dash"}, {"usr/bin/cat", "<host:/usr/bin/cat>"},
		{"usr/lib/x86_64-linux-gnu/libc.so.6", "<host:" + libc + ">"},
		{"usr/lib64/ld-linux-x86-64.so.2", "<host:" + ld + ">"},
		{"etc/", ""}, {"etc/passwd", "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n"},
		{"etc/group", "root:x:0:\napp:x:1000:\n"},
		{"etc/motd", "base\n"}, {"etc/gone", "should be hidden\n"},
		{"tmp/", "1777"}, {"root/", ""}, {"srv/", ""},
	})
	top := tarLayer(t, [][2]string{
		{"etc/", ""}, {"etc/motd", "top\n"}, {"etc/.wh.gone", ""}, {"srv/app.conf", "port=80\n"},
	})
	img, err := mutate.AppendLayers(empty.Image, base, top)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/usr/bin:/bin", "FROM_IMAGE=yes", "OVERRIDE=image"}
	cf.Config.WorkingDir = "/srv"
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestImagesEndToEnd(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	ref := host + "/test/tiny:1"
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, tinyImage(t)); err != nil {
		t.Fatal(err)
	}

	out, errOut, code := d.cli("", "pull", ref)
	if code != 0 {
		t.Fatalf("sbx pull: exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "sha256:") {
		t.Errorf("pull output: %q", out)
	}
	if out, _, _ := d.cli("", "images", "ls"); !strings.Contains(out, "test/tiny:1") {
		t.Errorf("images ls: %q", out)
	}

	c := d.client()
	sb, err := c.Create(ctx, sbx.CreateOptions{Image: ref, Env: map[string]string{"OVERRIDE": "request"}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	got := mustRun(t, ctx, sb, `cat /etc/motd; test -e /etc/gone && echo visible; echo "$FROM_IMAGE $OVERRIDE $(pwd)"; cat app.conf; test -e /usr/bin/python3 && echo host-usr; echo ok`)
	if want := "top\nyes request /srv\nport=80\nok\n"; got != want {
		t.Errorf("in the image: got %q, want %q", got, want)
	}
	if fi, err := sb.Stat(ctx, "/etc/motd"); err != nil || fi.GetUid() != 0 {
		t.Errorf("owner of an image file inside: %v %v, want uid 0", fi, err)
	}
	// The writable layer sits on top; the image's layers stay untouched.
	mustRun(t, ctx, sb, "echo changed > /etc/motd")
	sb2, err := c.Create(ctx, sbx.CreateOptions{Image: ref})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb2.ID)
	if got := mustRun(t, ctx, sb2, "cat /etc/motd"); got != "top\n" {
		t.Errorf("second sandbox sees %q: a layer was modified", got)
	}
	if sb.Info.GetImageDigest() == "" {
		t.Error("sandbox does not report its image digest")
	}

	// Users: the image's passwd names them; files they create are theirs.
	sbU, err := c.Create(ctx, sbx.CreateOptions{Image: ref, User: "app"})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sbU.ID)
	status := mustRun(t, ctx, sbU, "cat /proc/self/status; echo HOME=$HOME; pwd")
	for _, want := range []string{"Uid:\t1000\t", "Gid:\t1000\t", "CapEff:\t0000000000000000", "HOME=/home/app", "\n/srv\n"} {
		if !strings.Contains(status, want) {
			t.Errorf("as user app: %q missing from\n%s", want, status)
		}
	}
	if res, _ := sbU.RunOpts(ctx, sbx.ExecOptions{Shell: "cat /proc/self/status", User: "root"}); !strings.Contains(string(res.Stdout), "Uid:\t0\t") {
		t.Errorf("per-exec user root: %s", res.Stdout)
	}
	if _, err := sbU.RunOpts(ctx, sbx.ExecOptions{Shell: "true", User: "nobody-here"}); !sbx.IsInvalidArgument(err) {
		t.Errorf("unknown user: got %v, want InvalidArgument", err)
	}
	if err := sbU.Destroy(ctx); err != nil {
		t.Fatal(err)
	}

	// In use: cannot be removed.
	if _, errOut, code := d.cli("", "images", "rm", ref); code == 0 || !strings.Contains(errOut, "used by a sandbox") {
		t.Errorf("rm of an image in use: exit %d %q", code, errOut)
	}
	// Export, then import under another name.
	tarPath := filepath.Join(t.TempDir(), "tiny.tar")
	if _, errOut, code := d.cli("", "images", "export", ref, "-o", tarPath); code != 0 {
		t.Fatalf("export: %s", errOut)
	}
	if out, errOut, code := d.cli("", "images", "import", "--tag", "local/tiny:copy", tarPath); code != 0 || !strings.Contains(out, "local/tiny:copy") {
		t.Fatalf("import: %d %q %q", code, out, errOut)
	}
	sb3, err := c.Create(ctx, sbx.CreateOptions{Image: "local/tiny:copy"})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb3.ID)
	mustRun(t, ctx, sb3, "cat /etc/motd")
	for _, s := range []*sbx.Sandbox{sb, sb2, sb3} {
		if err := s.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, img := range []string{ref, "local/tiny:copy"} {
		if _, errOut, code := d.cli("", "images", "rm", img); code != 0 {
			t.Errorf("images rm %s: %s", img, errOut)
		}
	}
	if out, _, _ := d.cli("", "images", "prune"); !strings.HasPrefix(out, "freed ") || strings.HasPrefix(out, "freed 0B") {
		t.Errorf("prune: %q", out)
	}
	// A create from the removed image pulls it again (the registry still
	// has it); once the registry is gone, it fails naming the image.
	sb4, err := c.Create(ctx, sbx.CreateOptions{Image: ref})
	if err != nil {
		t.Fatalf("create from a removed image: %v, want it pulled again", err)
	}
	d.remember(sb4.ID)
	if err := sb4.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := d.cli("", "images", "rm", ref); code != 0 {
		t.Errorf("images rm %s: %s", ref, errOut)
	}
	reg.Close()
	if _, err := c.Create(ctx, sbx.CreateOptions{Image: ref}); err == nil || !strings.Contains(err.Error(), ref) {
		t.Errorf("create from a removed image, registry gone: got %v, want an error naming %s", err, ref)
	}
	d.assertNoLeaks()
}
