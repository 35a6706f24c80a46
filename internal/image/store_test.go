//go:build linux

package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/testutil"
)

var testConfig = v1.Config{
	Env:        []string{"PATH=/usr/bin:/bin", "GREETING=hi"},
	WorkingDir: "/work",
	User:       "1000:1000",
	Entrypoint: []string{"/bin/sh", "-c"},
	Cmd:        []string{"echo hi"},
	Labels:     map[string]string{"org.example": "yes"},
}

// startRegistry runs go-containerregistry's in-memory registry on loopback.
// wrap, if not nil, sits in front of it (to misbehave).
func startRegistry(t testing.TB, wrap func(http.Handler) http.Handler) string {
	t.Helper()
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// layerOf builds a gzip layer from tar entries.
func layerOf(t testing.TB, ents ...ent) v1.Layer {
	t.Helper()
	b := tarOf(t, ents...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// imageOf stacks layers into a linux/amd64 image with testConfig.
func imageOf(t testing.TB, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", "amd64", testConfig
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func push(t testing.TB, ref string, img v1.Image) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

func openStore(t testing.TB, dir string) *Store {
	t.Helper()
	testutil.RequiresRoot(t)
	s, err := Open(context.Background(), Config{Dir: dir, UIDShift: testShift, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func digestOfImage(t testing.TB, img v1.Image) string {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func inode(t testing.TB, p string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func TestPull(t *testing.T) {
	reg := startRegistry(t, nil)
	s := openStore(t, t.TempDir())
	ctx := context.Background()

	root := file("etc/os-release", "ID=sbx\n")
	root.hdr.Uid = 0
	owned := file("home/u/.profile", "x")
	owned.hdr.Uid, owned.hdr.Gid = 1000, 1000
	base := layerOf(t, dir("etc/", 0o755), root, dir("tmp/", 0o1777))
	imgA := imageOf(t, base, layerOf(t, owned, file("etc/.wh.os-release", "")))
	imgB := imageOf(t, base, layerOf(t, file("b", "B")))
	push(t, reg+"/sbx/a:v1", imgA)
	push(t, reg+"/sbx/b:v1", imgB)

	var events []Progress
	a, err := s.Pull(ctx, reg+"/sbx/a:v1", func(p Progress) { events = append(events, p) })
	if err != nil {
		t.Fatalf("pull: %v", err)
	}
	if a.Digest != digestOfImage(t, imgA) || a.Ref != reg+"/sbx/a:v1" || len(a.Layers) != 2 {
		t.Errorf("pulled %+v; want digest %s, 2 layers", a, digestOfImage(t, imgA))
	}
	want := ImageConfig{Env: testConfig.Env, WorkingDir: "/work", User: "1000:1000",
		Entrypoint: testConfig.Entrypoint, Cmd: testConfig.Cmd, Labels: testConfig.Labels}
	if diff := cmp.Diff(want, a.Config); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	if b, err := os.ReadFile(filepath.Join(a.Layers[0], "etc/os-release")); err != nil || string(b) != "ID=sbx\n" {
		t.Errorf("lower layer etc/os-release = %q, %v", b, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(a.Layers[1], "home/u/.profile"), &st); err != nil || st.Uid != testShift+1000 {
		t.Errorf("home/u/.profile owner %d, %v; want %d", st.Uid, err, testShift+1000)
	}
	if err := unix.Lstat(filepath.Join(a.Layers[1], "etc/os-release"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
		t.Errorf("etc/os-release in upper layer: mode %o, %v; want a whiteout", st.Mode, err)
	}
	if !slices.ContainsFunc(events, func(p Progress) bool { return p.Status == "done" }) {
		t.Errorf("progress events %+v; want some done", events)
	}
	if a.Size <= 0 {
		t.Errorf("size %d; want > 0", a.Size)
	}

	// The second image reuses the base layer's dir without unpacking it again.
	ino := inode(t, a.Layers[0])
	unpacked := s.unpacked.Load()
	events = nil
	b, err := s.Pull(ctx, reg+"/sbx/b:v1", func(p Progress) { events = append(events, p) })
	if err != nil {
		t.Fatalf("pull b: %v", err)
	}
	if b.Layers[0] != a.Layers[0] || inode(t, b.Layers[0]) != ino {
		t.Errorf("base layer of b is %s; want %s, same inode", b.Layers[0], a.Layers[0])
	}
	if got := s.unpacked.Load() - unpacked; got != 1 {
		t.Errorf("pulling b unpacked %d layers; want 1", got)
	}
	if !slices.ContainsFunc(events, func(p Progress) bool { return p.Status == "exists" }) {
		t.Errorf("progress events %+v; want the base layer reported as existing", events)
	}

	// Lookups: by ref, by digest prefix, by alias; survives a reopen.
	if err := s.Tag(ctx, a.Digest[:15], "sbx-test-alias"); err != nil {
		t.Fatalf("tag: %v", err)
	}
	s.Close()
	s = openStore(t, s.cfg.Dir)
	for _, ref := range []string{reg + "/sbx/a:v1", a.Digest, a.Digest[7:19], "sbx-test-alias", "index.docker.io/library/sbx-test-alias:latest"} {
		got, err := s.Get(ctx, ref)
		if err != nil || got.Digest != a.Digest || !slices.Equal(got.Layers, a.Layers) {
			t.Errorf("Get(%q) = %+v, %v; want %s", ref, got, err, a.Digest)
		}
	}
	if _, err := s.Get(ctx, "sbx/nope"); !errdefs.IsNotFound(err) {
		t.Errorf("Get(missing) = %v; want ErrNotFound", err)
	}
	if _, err := s.Pull(ctx, reg+"/sbx/nope:v1", nil); !errdefs.IsNotFound(err) {
		t.Errorf("Pull(missing) = %v; want ErrNotFound", err)
	}
	list, _ := s.List(ctx)
	if len(list) != 3 {
		t.Errorf("List has %d entries; want 3 (a, alias, b)", len(list))
	}
	images, layers, size, err := s.DiskUsage(ctx)
	if err != nil || images != 2 || layers != 3 || size <= 0 {
		t.Errorf("DiskUsage = %d images, %d layers, %d bytes, %v; want 2, 3, >0", images, layers, size, err)
	}
}

func TestPullConcurrentSameLayers(t *testing.T) {
	reg := startRegistry(t, nil)
	s := openStore(t, t.TempDir())
	img := imageOf(t, layerOf(t, file("a", "a")), layerOf(t, file("b", "b")))
	push(t, reg+"/sbx/c:v1", img)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { _, errs[i] = s.Pull(context.Background(), reg+"/sbx/c:v1", nil) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if got := s.unpacked.Load(); got != 2 {
		t.Errorf("unpacked %d layers for 4 concurrent pulls of a 2-layer image; want 2", got)
	}
}

func TestPullMultiArch(t *testing.T) {
	reg := startRegistry(t, nil)
	s := openStore(t, t.TempDir())
	amd := imageOf(t, layerOf(t, file("arch", "amd64")))
	arm := imageOf(t, layerOf(t, file("arch", "arm64")))
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}})
	r, _ := name.ParseReference(reg + "/sbx/multi:v1")
	if err := remote.WriteIndex(r, idx); err != nil {
		t.Fatal(err)
	}
	got, err := s.Pull(context.Background(), r.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != digestOfImage(t, amd) {
		t.Errorf("pulled %s; want the amd64 image %s", got.Digest, digestOfImage(t, amd))
	}
}

// TestPullLyingRegistry serves a layer blob whose bytes do not match its
// digest (corrupted, or another valid layer of the same size); the pull must
// fail and leave neither the blob nor a layer dir behind.
func TestPullLyingRegistry(t *testing.T) {
	rnd := func() string {
		b := make([]byte, 4096)
		rand.Read(b)
		return string(b)
	}
	good := layerOf(t, file("ok", "ok"))
	stored := func(body string) v1.Layer { // gzip without compression: same size for same-size input
		b := tarOf(t, file("evil", body))
		return must(tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
			tarball.WithCompressionLevel(gzip.NoCompression)))
	}
	bad, other := stored(rnd()), stored(rnd())
	badDigest, _ := bad.Digest()
	otherDigest, _ := other.Digest()
	if n1, _ := bad.Size(); n1 != must(other.Size()) {
		t.Fatalf("test layers differ in size: %d, %d", n1, must(other.Size()))
	}
	for _, mode := range []string{"corrupt", "swap"} {
		t.Run(mode, func(t *testing.T) {
			reg := startRegistry(t, func(h http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+badDigest.String()) {
						h.ServeHTTP(w, r)
						return
					}
					if mode == "swap" {
						r.URL.Path = strings.TrimSuffix(r.URL.Path, badDigest.String()) + otherDigest.String()
					}
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, r)
					body := rec.Body.Bytes()
					if mode == "corrupt" {
						body[len(body)/2] ^= 0xff // same length, different bytes
					}
					w.WriteHeader(rec.Code)
					w.Write(body)
				})
			})
			s := openStore(t, t.TempDir())
			push(t, reg+"/sbx/liar:v1", imageOf(t, good, bad))
			push(t, reg+"/sbx/other:v1", imageOf(t, other))
			_, err := s.Pull(context.Background(), reg+"/sbx/liar:v1", nil)
			if err == nil {
				t.Fatal("pull of a lying layer succeeded")
			}
			t.Logf("error: %v", err)
			if _, err := os.Stat(s.blobPath(badDigest.String())); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("lying blob stored: %v", err)
			}
			if ents, _ := os.ReadDir(s.tmpDir()); len(ents) != 0 {
				t.Errorf("tmp holds %d leftovers", len(ents))
			}
			if list, _ := s.List(context.Background()); len(list) != 0 {
				t.Errorf("store lists %d images; want none", len(list))
			}
			// Only the good layer may have been unpacked.
			if n := s.unpacked.Load(); n > 1 {
				t.Errorf("%d layers unpacked; want at most the good one", n)
			}
		})
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestLayerVerification feeds ensureLayer blobs whose digests lie.
func TestLayerVerification(t *testing.T) {
	s := openStore(t, t.TempDir())
	data := tarOf(t, file("f", "content"))
	dgst := digestOf(data)
	zeros := bytes.Repeat([]byte{0}, 4<<20)
	tests := []struct {
		name string
		l    recordLayer
		blob []byte
		max  int64
		want string
	}{
		{"diff id lie", recordLayer{Digest: dgst, DiffID: digestOf([]byte("x")), Size: int64(len(data))}, data, 0, "config says diff_id"},
		{"digest lie", recordLayer{Digest: digestOf([]byte("x")), DiffID: dgst, Size: int64(len(data))}, data, 0, "blob digest is"},
		{"size lie", recordLayer{Digest: dgst, DiffID: dgst, Size: 100}, data, 0, "compressed blob larger than 100"},
		{"bomb", recordLayer{Digest: digestOf(gz(t, zeros)), DiffID: digestOf(zeros), Size: int64(len(gz(t, zeros)))}, gz(t, zeros), 1 << 20, "uncompressed layer larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s.cfg.MaxLayerBytes = DefaultMaxLayerBytes
			if tt.max != 0 {
				s.cfg.MaxLayerBytes = tt.max
			}
			_, err := s.ensureLayer(context.Background(), tt.l, func() (io.ReadCloser, error) {
				return io.NopCloser(bytes.NewReader(tt.blob)), nil
			}, func(Progress) {})
			if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("ensureLayer = %v; want an invalid-argument error containing %q", err, tt.want)
			}
			for _, d := range []string{s.tmpDir(), filepath.Join(s.cfg.Dir, "layers"), filepath.Join(s.cfg.Dir, "blobs/sha256")} {
				if ents, _ := os.ReadDir(d); len(ents) != 0 {
					t.Errorf("%s holds %d entries after a rejected layer", d, len(ents))
				}
			}
		})
	}
}

func gz(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestPullHostileLayer: a traversal in a pulled layer rejects the pull, and
// nothing of it stays in the store.
func TestPullHostileLayer(t *testing.T) {
	reg := startRegistry(t, nil)
	s := openStore(t, t.TempDir())
	push(t, reg+"/sbx/evil:v1", imageOf(t, layerOf(t, file("ok", "ok"), symlink("etc", "/etc"), file("etc/sbx-evil", "x"))))
	_, err := s.Pull(context.Background(), reg+"/sbx/evil:v1", nil)
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `entry "etc/sbx-evil"`) {
		t.Fatalf("pull = %v; want an invalid-argument error naming the entry", err)
	}
	if _, err := os.Lstat("/etc/sbx-evil"); err == nil {
		os.Remove("/etc/sbx-evil")
		t.Fatal("/etc/sbx-evil was written")
	}
	for _, d := range []string{s.tmpDir(), filepath.Join(s.cfg.Dir, "layers")} {
		if ents, _ := os.ReadDir(d); len(ents) != 0 {
			t.Errorf("%s holds %d entries after a rejected pull", d, len(ents))
		}
	}
}

func TestPullCompressions(t *testing.T) {
	reg := startRegistry(t, nil)
	s := openStore(t, t.TempDir())
	b := tarOf(t, file("z", "zstd"))
	zl, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithCompression(compression.ZStd))
	if err != nil {
		t.Fatal(err)
	}
	u := tarOf(t, file("u", "plain"))
	ul, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(u)), nil },
		tarball.WithCompression(compression.None), tarball.WithMediaType(types.DockerUncompressedLayer))
	if err != nil {
		t.Fatal(err)
	}
	push(t, reg+"/sbx/comp:v1", imageOf(t, zl, ul))
	img, err := s.Pull(context.Background(), reg+"/sbx/comp:v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range map[int]string{0: "z", 1: "u"} {
		if _, err := os.Stat(filepath.Join(img.Layers[i], want)); err != nil {
			t.Errorf("layer %d: %v", i, err)
		}
	}
}
