//go:build linux

package image

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// dockerSave builds a docker-save archive of a one-layer image holding the
// file "id" with body id, named repoTags (which may be hostile).
func dockerSave(t *testing.T, id string, repoTags ...string) []byte {
	t.Helper()
	layer := tarOf(t, file("id", id))
	cfg := v1.ConfigFile{OS: "linux", Architecture: "amd64", Config: testConfig,
		RootFS: v1.RootFS{Type: "layers", DiffIDs: []v1.Hash{must(v1.NewHash(digestOf(layer)))}}}
	cb, _ := json.Marshal(cfg)
	mj, _ := json.Marshal(tarball.Manifest{{Config: "cfg.json", RepoTags: repoTags, Layers: []string{"l/layer.tar"}}})
	return tarOf(t, file("cfg.json", string(cb)), file("l/layer.tar", string(layer)), file("manifest.json", string(mj)))
}

// noEvil fails if any name under dir mentions "evil" or index.json does.
func noEvil(t *testing.T, dir string) {
	t.Helper()
	filepath.WalkDir(filepath.Dir(dir), func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.Contains(d.Name(), "evil") {
			t.Errorf("%s exists: a name from the archive became a path", p)
		}
		return nil
	})
	if b, err := os.ReadFile(filepath.Join(dir, "index.json")); err != nil || bytes.Contains(b, []byte("evil")) {
		t.Errorf("index.json = %s, %v; want no evil ref", b, err)
	}
}

// TestImportArchiveNames imports a hostile docker-save archive whose
// RepoTags claim an existing tag and a path-like name: only the tags the
// caller gives are applied, the archive's are reported.
func TestImportArchiveNames(t *testing.T) {
	ctx := context.Background()
	// The store lives one level down so that anything escaping it (a ref
	// used as a path, "../../evil") would land in the walked parent.
	dir := filepath.Join(t.TempDir(), "a", "store")
	s := openStore(t, dir)
	victim, err := s.Import(ctx, bytes.NewReader(dockerSave(t, "victim")), ImportOptions{Tags: []string{"victim:1"}})
	if err != nil {
		t.Fatal(err)
	}
	victimDigest := victim[0].Image.Digest
	hostile := dockerSave(t, "hostile", "victim:1", "../../evil:1")

	res, err := s.Import(ctx, bytes.NewReader(hostile), ImportOptions{Tags: []string{"mine:1"}})
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if got, want := res[0].Image.Ref, "index.docker.io/library/mine:1"; got != want {
		t.Errorf("imported ref = %q; want %q", got, want)
	}
	if got, want := res[0].ArchiveTags, []string{"index.docker.io/library/victim:1"}; !slices.Equal(got, want) {
		t.Errorf("reported archive tags = %q; want %q", got, want)
	}
	if got, want := res[0].RejectedTags, []string{`"../../evil:1"`}; !slices.Equal(got, want) {
		t.Errorf("reported rejected tags = %q; want %q", got, want)
	}
	hostileDigest := res[0].Image.Digest
	check := func(what string, wantMine string) {
		t.Helper()
		if img, err := s.Get(ctx, "victim:1"); err != nil || img.Digest != victimDigest {
			t.Errorf("%s: victim:1 = %v, %v; want it still at %s", what, img, err, victimDigest)
		}
		if img, err := s.Get(ctx, "mine:1"); wantMine != "" && (err != nil || img.Digest != wantMine) {
			t.Errorf("%s: mine:1 = %v, %v; want %s", what, img, err, wantMine)
		}
		imgs, _ := s.List(ctx)
		for _, img := range imgs {
			if strings.Contains(img.Ref, "evil") {
				t.Errorf("%s: listed ref %q", what, img.Ref)
			}
		}
		noEvil(t, dir)
	}
	check("import --tag", hostileDigest)

	// Asked for, the archive's names are checked: the bad one fails the
	// import, naming it, before anything is stored or tagged.
	s2 := openStore(t, filepath.Join(t.TempDir(), "b", "store"))
	if _, err := s2.Import(ctx, bytes.NewReader(hostile), ImportOptions{UseArchiveTags: true}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `"../../evil:1"`) {
		t.Errorf("import with archive tags = %v; want ErrInvalidArgument naming \"../../evil:1\"", err)
	}
	if imgs, _ := s2.List(ctx); len(imgs) != 0 {
		t.Errorf("after a refused import the store lists %d images", len(imgs))
	}
	// A valid archive name that would move an existing tag is refused...
	claim := dockerSave(t, "claim", "victim:1", "fresh:1")
	if _, err := s.Import(ctx, bytes.NewReader(claim), ImportOptions{UseArchiveTags: true}); !errdefs.IsAlreadyExists(err) || !strings.Contains(err.Error(), "victim:1") {
		t.Errorf("import moving victim:1 = %v; want ErrAlreadyExists naming it", err)
	}
	if _, err := s.Get(ctx, "fresh:1"); !errdefs.IsNotFound(err) {
		t.Errorf("fresh:1 after a refused import: %v; want ErrNotFound", err)
	}
	check("refused import", hostileDigest)
	// ...unless the caller says so.
	res, err = s.Import(ctx, bytes.NewReader(claim), ImportOptions{UseArchiveTags: true, ReplaceArchiveTags: true})
	if err != nil {
		t.Fatal(err)
	}
	if img, err := s.Get(ctx, "victim:1"); err != nil || img.Digest != res[0].Image.Digest {
		t.Errorf("victim:1 after an import replacing it = %v, %v; want %s", img, err, res[0].Image.Digest)
	}
}

// TestImportBadTags: the caller's tags are checked like pull's references,
// before the archive is read.
func TestImportBadTags(t *testing.T) {
	s := openStore(t, t.TempDir())
	for _, tag := range []string{"../../evil:1", "", strings.Repeat("a", 300), "a\x00b:1", "Upper:1", "x/../y:1",
		"x@sha256:" + strings.Repeat("0", 64)} {
		r := &failReader{}
		_, err := s.Import(context.Background(), r, ImportOptions{Tags: []string{tag}})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), quoteRef(tag)) {
			t.Errorf("import --tag %q = %v; want ErrInvalidArgument naming it", tag, err)
		}
		if r.read {
			t.Errorf("import --tag %q read the archive before refusing the tag", tag)
		}
	}
	if _, err := s.Import(context.Background(), bytes.NewReader(twoImages(t)), ImportOptions{Tags: []string{"mine:1"}}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("import --tag of a two-image archive = %v; want ErrInvalidArgument", err)
	}
	if imgs, _ := s.List(context.Background()); len(imgs) != 0 {
		t.Errorf("refused imports stored %d images", len(imgs))
	}
}

type failReader struct{ read bool }

func (f *failReader) Read([]byte) (int, error) { f.read = true; return 0, errors.New("read") }

func twoImages(t *testing.T) []byte {
	t.Helper()
	var ents []ent
	var m tarball.Manifest
	for _, id := range []string{"one", "two"} {
		layer := tarOf(t, file("id", id))
		cfg := v1.ConfigFile{OS: "linux", Architecture: "amd64",
			RootFS: v1.RootFS{Type: "layers", DiffIDs: []v1.Hash{must(v1.NewHash(digestOf(layer)))}}}
		cb, _ := json.Marshal(cfg)
		ents = append(ents, file(id+".json", string(cb)), file(id+"/layer.tar", string(layer)))
		m = append(m, tarball.Descriptor{Config: id + ".json", Layers: []string{id + "/layer.tar"}})
	}
	mj, _ := json.Marshal(m)
	return tarOf(t, append(ents, file("manifest.json", string(mj)))...)
}

// TestLoadDropsInvalidRefs: a store written before refs were checked may
// hold an archive's "../../evil:1"; it is forgotten on open.
func TestLoadDropsInvalidRefs(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openStore(t, dir)
	res, err := s.Import(ctx, bytes.NewReader(dockerSave(t, "x")), ImportOptions{Tags: []string{"ok:1"}})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	idx := indexFile{Version: 1, Refs: map[string]string{"index.docker.io/library/ok:1": res[0].Image.Digest, "../../evil:1": res[0].Image.Digest}}
	if err := writeJSON(filepath.Join(dir, "index.json"), idx); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir)
	imgs, _ := s.List(ctx)
	if len(imgs) != 1 || imgs[0].Ref != "index.docker.io/library/ok:1" {
		t.Errorf("after reopening: %+v; want only ok:1", imgs)
	}
}
