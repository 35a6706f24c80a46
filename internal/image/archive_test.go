//go:build linux

package image

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/testutil"
)

func TestExportImportRoundTrip(t *testing.T) {
	reg := startRegistry(t, nil)
	ctx := context.Background()
	img := imageOf(t, layerOf(t, file("a", "A")), layerOf(t, file("b", "B")))
	push(t, reg+"/sbx/rt:v1", img)
	s := openStore(t, t.TempDir())
	orig, err := s.Pull(ctx, reg+"/sbx/rt:v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := s.Export(ctx, "sbx/nope", &buf); !errdefs.IsNotFound(err) {
		t.Errorf("Export(missing) = %v; want ErrNotFound", err)
	}
	if err := s.Export(ctx, orig.Digest[:12], &buf); err != nil {
		t.Fatalf("export: %v", err)
	}
	// A docker-save archive: manifest.json naming the image by its tag.
	m, err := tarball.LoadManifest(func() (rc io.ReadCloser, err error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil || len(m) != 1 || len(m[0].RepoTags) != 1 || m[0].RepoTags[0] != reg+"/sbx/rt:v1" {
		t.Fatalf("exported manifest.json = %+v, %v", m, err)
	}

	fresh := openStore(t, t.TempDir())
	imgs, err := importedImages(fresh.Import(ctx, bytes.NewReader(buf.Bytes()), ImportOptions{UseArchiveTags: true}))
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if len(imgs) != 1 || imgs[0].Digest != orig.Digest || imgs[0].Ref != orig.Ref {
		t.Fatalf("imported %+v; want digest %s ref %s", imgs, orig.Digest, orig.Ref)
	}
	if b, err := os.ReadFile(filepath.Join(imgs[0].Layers[1], "b")); err != nil || string(b) != "B" {
		t.Errorf("imported layer file b = %q, %v", b, err)
	}
	if imgs[0].Config.WorkingDir != "/work" {
		t.Errorf("imported config %+v", imgs[0].Config)
	}
}

// importedImages returns the images of an import's results.
func importedImages(res []ImportResult, err error) ([]*Image, error) {
	var out []*Image
	for _, r := range res {
		out = append(out, r.Image)
	}
	return out, err
}

// tarDir packs a directory (an OCI layout) into a tar.
func tarDir(t *testing.T, dir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		hdr.Name, _ = filepath.Rel(dir, p)
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	tw.Close()
	return buf.Bytes()
}

func TestImportOCILayout(t *testing.T) {
	s := openStore(t, t.TempDir())
	img := imageOf(t, layerOf(t, file("etc/hostname", "oci\n")))
	named := imageOf(t, layerOf(t, file("x", "x")))
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	// Docker 25 names images with the containerd annotation; a bare tag in
	// ref.name names no repository.
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name": "example.com/sbx/oci:v1", "org.opencontainers.image.ref.name": "v1"})); err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(named, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "latest"})); err != nil {
		t.Fatal(err)
	}
	imgs, err := importedImages(s.Import(context.Background(), bytes.NewReader(tarDir(t, dir)), ImportOptions{UseArchiveTags: true}))
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if len(imgs) != 2 || imgs[0].Digest != digestOfImage(t, img) || imgs[0].Ref != "example.com/sbx/oci:v1" ||
		imgs[1].Digest != digestOfImage(t, named) || imgs[1].Ref != "" {
		t.Fatalf("imported %+v", imgs)
	}
	got, err := s.Get(context.Background(), "example.com/sbx/oci:v1")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(got.Layers[0], "etc/hostname")); err != nil || string(b) != "oci\n" {
		t.Errorf("etc/hostname = %q, %v", b, err)
	}
	if _, err := s.Get(context.Background(), imgs[1].Digest); err != nil {
		t.Errorf("untagged image by digest: %v", err)
	}
}

// TestImportDockerSave imports what `docker save` wrote before Docker 25:
// uncompressed layer.tar files, one of them a symlink to a shared layer.
func TestImportDockerSave(t *testing.T) {
	s := openStore(t, t.TempDir())
	layer := tarOf(t, file("bin/sh", "#!"))
	cfg := v1.ConfigFile{OS: "linux", Architecture: "amd64", Config: testConfig,
		RootFS: v1.RootFS{Type: "layers", DiffIDs: []v1.Hash{must(v1.NewHash(digestOf(layer)))}}}
	cb, _ := json.Marshal(cfg)
	mj, _ := json.Marshal(tarball.Manifest{
		{Config: "cfg.json", RepoTags: []string{"sbx/saved:v1"}, Layers: []string{"aaa/layer.tar"}},
		{Config: "cfg.json", RepoTags: []string{"sbx/saved:v2"}, Layers: []string{"bbb/layer.tar"}},
	})
	ar := tarOf(t, file("cfg.json", string(cb)), file("aaa/layer.tar", string(layer)),
		symlink("bbb/layer.tar", "../aaa/layer.tar"), file("manifest.json", string(mj)))
	imgs, err := importedImages(s.Import(context.Background(), bytes.NewReader(ar), ImportOptions{UseArchiveTags: true}))
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if len(imgs) != 2 || imgs[0].Ref != "index.docker.io/sbx/saved:v1" || imgs[0].Digest != imgs[1].Digest {
		t.Fatalf("imported %+v", imgs)
	}
	if b, err := os.ReadFile(filepath.Join(imgs[0].Layers[0], "bin/sh")); err != nil || string(b) != "#!" {
		t.Errorf("bin/sh = %q, %v", b, err)
	}
	// Re-exported, the uncompressed layer stays uncompressed and the
	// rebuilt manifest is the same.
	var buf bytes.Buffer
	if err := s.Export(context.Background(), "sbx/saved:v2", &buf); err != nil {
		t.Fatal(err)
	}
	// Without UseArchiveTags the archive's name is reported, not applied.
	again, err := openStore(t, t.TempDir()).Import(context.Background(), &buf, ImportOptions{})
	if err != nil || len(again) != 1 || again[0].Image.Digest != imgs[0].Digest || again[0].Image.Ref != "" ||
		!slices.Equal(again[0].ArchiveTags, []string{"index.docker.io/sbx/saved:v2"}) {
		t.Errorf("re-import = %+v, %v; want digest %s, untagged, archive tag sbx/saved:v2", again, err, imgs[0].Digest)
	}
	if _, err := s.Import(context.Background(), bytes.NewReader(tarOf(t, file("hello", "x"))), ImportOptions{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("import of a random tar = %v; want ErrInvalidArgument", err)
	}
}

func TestRemovePrune(t *testing.T) {
	reg := startRegistry(t, nil)
	ctx := context.Background()
	s := openStore(t, t.TempDir())
	base := layerOf(t, file("base", "base"))
	push(t, reg+"/sbx/a:v1", imageOf(t, base, layerOf(t, file("a", "a"))))
	push(t, reg+"/sbx/b:v1", imageOf(t, base, layerOf(t, file("b", "b"))))
	a, err := s.Pull(ctx, reg+"/sbx/a:v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Pull(ctx, reg+"/sbx/b:v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }

	if err := s.Remove(ctx, reg+"/sbx/a:v1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, reg+"/sbx/a:v1"); !errdefs.IsNotFound(err) {
		t.Errorf("Get after Remove = %v; want ErrNotFound", err)
	}
	if !exists(a.Layers[1]) {
		t.Error("Remove deleted a layer; layers must stay until Prune")
	}
	// a's top layer is still used by a sandbox: it stays.
	if _, err := s.Prune(ctx, map[string]bool{a.Layers[1]: true}); err != nil {
		t.Fatal(err)
	}
	if !exists(a.Layers[1]) || !exists(a.Layers[0]) || !exists(b.Layers[1]) {
		t.Fatal("Prune deleted a layer in use")
	}
	// The sandbox is gone: a's top layer goes, the shared base stays for b.
	freed, err := s.Prune(ctx, nil)
	if err != nil || freed <= 0 {
		t.Errorf("Prune = %d, %v; want bytes freed", freed, err)
	}
	if exists(a.Layers[1]) || !exists(b.Layers[0]) || !exists(b.Layers[1]) {
		t.Errorf("after Prune: a top %v, base %v, b top %v; want false, true, true",
			exists(a.Layers[1]), exists(b.Layers[0]), exists(b.Layers[1]))
	}
	if err := s.Remove(ctx, b.Digest); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prune(ctx, nil); err != nil {
		t.Fatal(err)
	}
	images, layers, size, err := s.DiskUsage(ctx)
	if err != nil || images != 0 || layers != 0 || size != 0 {
		t.Errorf("DiskUsage after removing everything = %d, %d, %d, %v; want zeros", images, layers, size, err)
	}
	// A pull after a prune unpacks again.
	if _, err := s.Pull(ctx, reg+"/sbx/a:v1", nil); err != nil {
		t.Fatal(err)
	}
}

// TestImportTooLarge: an archive over MaxArchiveBytes is refused without
// being spooled further, and nothing is left in the store's tmp dir.
func TestImportTooLarge(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	s, err := Open(context.Background(), Config{Dir: dir, UIDShift: testShift, MaxArchiveBytes: 1 << 20, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.Import(context.Background(), io.LimitReader(zeroReader{}, 8<<20), ImportOptions{})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "larger than the limit") {
		t.Errorf("got %v, want an InvalidArgument naming the limit", err)
	}
	if ents, _ := os.ReadDir(s.tmpDir()); len(ents) != 0 {
		t.Errorf("tmp dir holds %d entries after a refused import", len(ents))
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
