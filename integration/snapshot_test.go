package integration

import (
	"context"
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
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// toolImage is tinyImage plus rm, ln, readlink and touch (libc-only
// binaries of the host) and a directory /opt/old with a file in it.
func toolImage(t *testing.T) v1.Image {
	t.Helper()
	tools := tarLayer(t, [][2]string{
		{"usr/bin/rm", "<host:/usr/bin/rm>"}, {"usr/bin/ln", "<host:/usr/bin/ln>"},
		{"usr/bin/readlink", "<host:/usr/bin/readlink>"}, {"usr/bin/touch", "<host:/usr/bin/touch>"},
		{"opt/", ""}, {"opt/old/", ""}, {"opt/old/keep", "kept\n"},
	})
	img, err := mutate.AppendLayers(tinyImage(t), tools)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// pushTestImage serves img from a registry on loopback, pulls it into d
// and returns its reference.
func pushTestImage(t *testing.T, ctx context.Context, d *daemon, repo string, img v1.Image) string {
	t.Helper()
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	ref := strings.TrimPrefix(reg.URL, "http://") + "/" + repo
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client().Images().Pull(ctx, ref, nil); err != nil {
		t.Fatal(err)
	}
	return ref
}

func TestSnapshot(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	c := d.client()
	ref := pushTestImage(t, ctx, d, "test/tools:1", toolImage(t))
	layersBefore := layerDirs(t, d)

	sb, err := c.Create(ctx, sbx.CreateOptions{Image: ref, Env: map[string]string{"X": "1"},
		Secrets: map[string]string{"TOKEN": "secret-value"}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	mustRun(t, ctx, sb, strings.Join([]string{
		"echo new > /srv/new.txt",
		"ln /srv/new.txt /srv/hard",
		"rm /etc/motd /srv/app.conf", // from the top and from both layers
		"ln -s /etc/shadow /srv/evil",
		"ln -s ../../../../../../etc/shadow /srv/evil-rel",
		"rm -r /opt/old",
	}, " && "))
	if err := sb.MakeDir(ctx, "/opt/old", false); err != nil {
		t.Fatal(err)
	}
	if err := sb.MakeDir(ctx, "/data/sub", true); err != nil {
		t.Fatal(err)
	}
	mustRun(t, ctx, sb, "echo fresh > /opt/old/fresh && echo deep > /data/sub/f")
	if res, err := sb.RunOpts(ctx, sbx.ExecOptions{Shell: "touch /tmp/apps", User: "app"}); err != nil || res.Code != 0 {
		t.Fatalf("touch as app: %v %v", res, err)
	}

	img, err := sb.Snapshot(ctx, "local/snap:1")
	if err != nil {
		t.Fatal(err)
	}
	if img.GetRef() != "index.docker.io/local/snap:1" || img.GetLayers() != 4 {
		t.Errorf("snapshot image: ref %q, %d layers; want local/snap:1 with 4", img.GetRef(), img.GetLayers())
	}
	// Thawed afterwards.
	if got := mustRun(t, ctx, sb, "echo alive"); got != "alive\n" {
		t.Errorf("after snapshot: %q", got)
	}
	if env := strings.Join(img.GetConfig().GetEnv(), " "); !strings.Contains(env, "X=1") || strings.Contains(env, "TOKEN") {
		t.Errorf("snapshot env %q: want X=1 and no secret", env)
	}

	// A stopped sandbox stays stopped.
	if err := sb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Snapshot(ctx, "local/snap:stopped"); err != nil {
		t.Fatalf("snapshot of a stopped sandbox: %v", err)
	}
	if err := sb.Refresh(ctx); err != nil || sb.Info.GetState() != sbxv1.SandboxState_SANDBOX_STATE_STOPPED {
		t.Errorf("after snapshot of a stopped sandbox: %v %v", sb.Info.GetState(), err)
	}
	if err := sb.Start(ctx); err != nil {
		t.Fatal(err)
	}

	sb2, err := c.Create(ctx, sbx.CreateOptions{Image: "local/snap:1"})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb2.ID)
	got := mustRun(t, ctx, sb2, strings.Join([]string{
		"cat /srv/new.txt /srv/hard /data/sub/f /opt/old/fresh",
		"test -e /etc/motd || echo motd-gone",
		"test -e /srv/app.conf || echo conf-gone",
		"test -e /etc/gone || echo still-gone",
		"test -e /opt/old/keep || echo opaque",
		"readlink /srv/evil /srv/evil-rel",
		"cat /srv/evil 2>/dev/null || echo dangling",
		`echo "X=$X TOKEN=$TOKEN $(pwd)"`,
	}, "; "))
	want := "new\nnew\ndeep\nfresh\nmotd-gone\nconf-gone\nstill-gone\nopaque\n/etc/shadow\n../../../../../../etc/shadow\ndangling\nX=1 TOKEN= /srv\n"
	if got != want {
		t.Errorf("in the snapshot:\ngot  %q\nwant %q", got, want)
	}
	for p, uid := range map[string]uint32{"/srv/new.txt": 0, "/tmp/apps": 1000} {
		if fi, err := sb2.Stat(ctx, p); err != nil || fi.GetUid() != uid {
			t.Errorf("owner of %s: %v %v; want uid %d", p, fi.GetUid(), err, uid)
		}
	}
	// The snapshot's layer holds the symlinks as symlinks (nothing of the
	// host's /etc/shadow), and the image's own layers are untouched.
	var found int
	for l := range layerDirs(t, d) {
		for _, n := range []string{"srv/evil", "srv/evil-rel"} {
			if fi, err := os.Lstat(filepath.Join(l, n)); err == nil {
				found++
				if fi.Mode()&os.ModeSymlink == 0 {
					t.Errorf("%s in layer %s is not a symlink (mode %v)", n, l, fi.Mode())
				}
			}
		}
	}
	if found != 2 {
		t.Errorf("found %d planted symlinks in layers; want 2", found)
	}
	for l := range layersBefore {
		if _, err := os.Stat(filepath.Join(l, "srv", "new.txt")); err == nil {
			t.Errorf("an original layer %s was modified", l)
		}
	}
	orig, err := c.Create(ctx, sbx.CreateOptions{Image: ref})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(orig.ID)
	if got := mustRun(t, ctx, orig, "cat /etc/motd /opt/old/keep; test -e /srv/new.txt || echo clean"); got != "top\nkept\nclean\n" {
		t.Errorf("the original image now shows %q", got)
	}

	// CLI, and a snapshot of a snapshot.
	if out, errOut, code := d.cli("", "snapshot", sb2.ID, "-t", "local/snap:2"); code != 0 || !strings.Contains(out, "local/snap:2 sha256:") {
		t.Errorf("sbx snapshot: exit %d, %q, %q", code, out, errOut)
	}
	// A host-image sandbox snapshots to an image that stacks on the host
	// image again: its changes plus the host's /usr.
	host, err := c.Create(ctx, sbx.CreateOptions{Env: map[string]string{"MARK": "m1"}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(host.ID)
	mustRun(t, ctx, host, "mkdir -p /opt/app && echo from-host-sandbox > /opt/app/data && rm /etc/nsswitch.conf")
	if _, err := host.Snapshot(ctx, "local/host:1"); err != nil {
		t.Fatalf("snapshot of a host sandbox: %v", err)
	}
	fromHost, err := c.Create(ctx, sbx.CreateOptions{Image: "local/host:1"})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(fromHost.ID)
	got = mustRun(t, ctx, fromHost, `cat /opt/app/data; test -e /etc/nsswitch.conf && echo nss; echo $MARK; python3 -c 'print("py ok")'`)
	if want := "from-host-sandbox\nm1\npy ok\n"; got != want {
		t.Errorf("sandbox from a host snapshot: got %q, want %q", got, want)
	}
	for _, s := range []*sbx.Sandbox{sb, sb2, orig, host, fromHost} {
		if err := s.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	d.assertNoLeaks()
}

// layerDirs lists the unpacked layers of d's image store.
func layerDirs(t *testing.T, d *daemon) map[string]bool {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(d.dataDir, "images", "layers"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range ents {
		if e.IsDir() {
			out[filepath.Join(d.dataDir, "images", "layers", e.Name())] = true
		}
	}
	return out
}
