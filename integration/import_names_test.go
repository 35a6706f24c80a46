package integration

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// writeDockerSave writes img as a docker-save archive whose manifest.json
// gives it repoTags, verbatim (an attacker's archive can say anything), and
// returns its path.
func writeDockerSave(t *testing.T, path string, img v1.Image, repoTags []string) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(name string, b []byte) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b))}); err != nil {
			t.Fatal(err)
		}
		tw.Write(b)
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	add("config.json", cfg)
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	desc := tarball.Descriptor{Config: "config.json", RepoTags: repoTags}
	for i, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("%d/layer.tar", i)
		add(name, b)
		desc.Layers = append(desc.Layers, name)
	}
	mj, err := json.Marshal(tarball.Manifest{desc})
	if err != nil {
		t.Fatal(err)
	}
	add("manifest.json", mj)
	tw.Close()
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestImportArchiveTags imports a hostile docker-save archive whose
// RepoTags claim an existing tag ("victim:1") and a path-like name
// ("../../evil:1") with `sbx images import --tag mine:1`: victim:1 keeps
// its image, nothing named evil appears anywhere, mine:1 is the import.
func TestImportArchiveTags(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	c := d.client()
	dir := t.TempDir()

	victimTar := writeDockerSave(t, filepath.Join(dir, "victim.tar"), tinyImage(t), nil)
	out, errOut, code := d.cli("", "images", "import", "--tag", "victim:1", victimTar)
	if code != 0 {
		t.Fatalf("import victim: exit %d: %s", code, errOut)
	}
	victimDigest := strings.Fields(out)[1]

	hostileImg, err := mutate.AppendLayers(tinyImage(t), tarLayer(t, [][2]string{{"etc/", ""}, {"etc/motd", "hostile\n"}}))
	if err != nil {
		t.Fatal(err)
	}
	hostileTar := writeDockerSave(t, filepath.Join(dir, "hostile.tar"), hostileImg, []string{"victim:1", "../../evil:1"})
	out, errOut, code = d.cli("", "images", "import", "--tag", "mine:1", hostileTar)
	if code != 0 {
		t.Fatalf("import hostile: exit %d: %s", code, errOut)
	}
	if !strings.HasPrefix(out, "index.docker.io/library/mine:1 sha256:") || strings.Count(out, "\n") != 1 {
		t.Errorf("import output %q; want one line for mine:1", out)
	}
	for _, want := range []string{"victim:1 (not applied", `"../../evil:1": not valid`} {
		if !strings.Contains(errOut, want) {
			t.Errorf("import's report lacks %q:\n%s", want, errOut)
		}
	}
	hostileDigest := strings.Fields(out)[1]
	if hostileDigest == victimDigest {
		t.Fatal("the two test images have the same digest")
	}

	check := func(what string) {
		t.Helper()
		if img, err := c.Images().Get(ctx, "victim:1"); err != nil || img.GetDigest() != victimDigest {
			t.Errorf("%s: victim:1 = %s, %v; want %s (re-pointed by the archive)", what, img.GetDigest(), err, victimDigest)
		}
		if img, err := c.Images().Get(ctx, "mine:1"); err != nil || img.GetDigest() != hostileDigest {
			t.Errorf("%s: mine:1 = %s, %v; want %s", what, img.GetDigest(), err, hostileDigest)
		}
		if ls, _, _ := d.cli("", "images", "ls"); strings.Contains(ls, "evil") {
			t.Errorf("%s: images ls shows an archive name:\n%s", what, ls)
		}
		// Nothing named after the archive's names in the data dir.
		filepath.WalkDir(d.dataDir, func(p string, e fs.DirEntry, err error) error {
			if err == nil && strings.Contains(e.Name(), "evil") {
				t.Errorf("%s: %s exists", what, p)
			}
			return nil
		})
		if b, err := os.ReadFile(filepath.Join(d.dataDir, "images", "index.json")); err == nil && bytes.Contains(b, []byte("evil")) {
			t.Errorf("%s: the image index records %s", what, b)
		}
	}
	check("import --tag mine:1")

	// A sandbox of victim:1 still runs the victim's image.
	sb, err := c.Create(ctx, sbx.CreateOptions{Image: "victim:1"})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	if got := mustRun(t, ctx, sb, "cat /etc/motd"); got != "top\n" {
		t.Errorf("victim:1 sandbox sees motd %q; want the victim's %q", got, "top\n")
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}

	// Asked for through the SDK, the archive's names are checked: the
	// import fails naming the bad one and changes nothing.
	f, err := os.Open(hostileTar)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := c.Images().ImportWith(ctx, f, sbx.ImportOptions{UseArchiveTags: true}); !sbx.IsInvalidArgument(err) || !strings.Contains(err.Error(), `"../../evil:1"`) {
		t.Errorf("import --use-archive-tags = %v; want InvalidArgument naming \"../../evil:1\"", err)
	}
	// A valid archive name that would move victim:1 is refused too.
	claimTar := writeDockerSave(t, filepath.Join(dir, "claim.tar"), hostileImg, []string{"victim:1"})
	if _, errOut, code := d.cli("", "images", "import", "--use-archive-tags", claimTar); code == 0 || !strings.Contains(errOut, "victim:1") {
		t.Errorf("import --use-archive-tags moving victim:1: exit %d %q; want a refusal naming it", code, errOut)
	}
	// The user's own tag is checked like pull's.
	for _, bad := range []string{"../../evil:1", "Upper:1", "x/../y:1"} {
		if _, errOut, code := d.cli("", "images", "import", "--tag", bad, hostileTar); code == 0 || !strings.Contains(errOut, fmt.Sprintf("%q", bad)) {
			t.Errorf("import --tag %q: exit %d %q; want a refusal naming it", bad, code, errOut)
		}
	}
	check("refused imports")
	d.assertNoLeaks()
}
