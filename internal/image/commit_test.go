//go:build linux

package image

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/errdefs"
)

func TestCommit(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, t.TempDir())
	baseCfg := ImageConfig{Env: []string{"A=1"}, WorkingDir: "/w", Entrypoint: []string{"/bin/sh"}}
	base, err := s.Commit(ctx, "", bytes.NewReader(tarOf(t, dir("etc/", 0o755), file("etc/a", "a"), file("etc/gone", "x"))), baseCfg, "local/base:1")
	if err != nil {
		t.Fatal(err)
	}
	if base.Ref != "index.docker.io/local/base:1" || len(base.Layers) != 1 {
		t.Fatalf("base = %+v", base)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(base.Layers[0], "etc/a"), &st); err != nil || st.Uid != testShift {
		t.Fatalf("committed layer file: uid %d, %v; want %d", st.Uid, err, testShift)
	}

	// A diff on top: a new file, a whiteout, an opaque dir.
	diff := tarOf(t, file("etc/b", "b"), ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "etc/.wh.gone"}},
		dir("opt/", 0o755), ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "opt/.wh..wh..opq"}})
	cfg := ImageConfig{Env: []string{"A=2"}, WorkingDir: "/app", User: "app"}
	top, err := s.Commit(ctx, base.Digest, bytes.NewReader(diff), cfg, "local/top:1")
	if err != nil {
		t.Fatal(err)
	}
	if len(top.Layers) != 2 || top.Layers[0] != base.Layers[0] {
		t.Fatalf("top layers = %v; want base's + 1", top.Layers)
	}
	if diff := cmp.Diff(cfg, top.Config); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	if err := unix.Lstat(filepath.Join(top.Layers[1], "etc/gone"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
		t.Errorf("whiteout not unpacked as a char device: %v", err)
	}
	layers, err := s.LayersOf(ctx, top.Digest)
	if err != nil || len(layers) != 2 {
		t.Fatalf("LayersOf = %v, %v", layers, err)
	}
	// Export round trip: a proper image.
	var exp bytes.Buffer
	if err := s.Export(ctx, "local/top:1", &exp); err != nil {
		t.Fatalf("export a committed image: %v", err)
	}

	// An empty diff adds no layer on top of a base with layers.
	empty, err := s.Commit(ctx, top.Digest, bytes.NewReader(tarOf(t)), cfg, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(empty.Layers) != 2 || empty.Digest == top.Digest {
		t.Errorf("empty diff: %d layers, digest %s (top %s); want 2 layers and a new image", len(empty.Layers), empty.Digest, top.Digest)
	}

	// Compose is deterministic for a fixed creation time and unpacks nothing.
	unpacked := s.unpacked.Load()
	when := time.Unix(1_700_000_000, 0)
	spec := ImageSpec{Config: cfg, CreatedBy: "RUN x", Created: when, Intermediate: true}
	c1, err := s.Compose(ctx, base.Digest, layers[1:], spec)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := s.Compose(ctx, base.Digest, layers[1:], spec)
	if err != nil || c2.Digest != c1.Digest {
		t.Fatalf("Compose twice: %s, %s, %v; want the same digest", c1.Digest, c2.Digest, err)
	}
	if s.unpacked.Load() != unpacked {
		t.Error("Compose unpacked a layer")
	}
	list, _ := s.List(ctx)
	for _, img := range list {
		if img.Digest == c1.Digest {
			t.Error("an untagged intermediate image is listed")
		}
	}
	// Prune forgets intermediate images; composing with a pruned layer fails.
	if err := s.Remove(ctx, "local/top:1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, empty.Digest); err != nil {
		t.Fatal(err)
	}
	// A lease (a build in progress) keeps an intermediate image and its layers.
	lease := s.NewLease()
	if _, err := s.Get(WithLease(ctx, lease), c1.Digest); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prune(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, c1.Digest); err != nil {
		t.Errorf("leased intermediate image after prune: %v; want it kept", err)
	}
	for _, l := range top.Layers[1:] {
		if _, err := os.Stat(l); err != nil {
			t.Errorf("leased image's layer after prune: %v", err)
		}
	}
	lease.Release()
	lease.Release() // idempotent
	if _, err := s.Prune(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, c1.Digest); !errdefs.IsNotFound(err) {
		t.Errorf("intermediate image after prune: %v; want NotFound", err)
	}
	if _, err := os.Stat(top.Layers[1]); err == nil {
		t.Error("prune kept the top layer")
	}
	if _, err := s.Compose(ctx, base.Digest, layers[1:], spec); !errdefs.IsNotFound(err) {
		t.Errorf("Compose with a pruned layer: %v; want NotFound", err)
	}
	// Bad input.
	if _, err := s.Commit(ctx, "", bytes.NewReader([]byte("not a tar at all, not at all")), cfg, ""); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Commit of garbage: %v; want InvalidArgument", err)
	}
	if _, err := s.Commit(ctx, "sha256:0000", bytes.NewReader(tarOf(t)), cfg, ""); !errdefs.IsNotFound(err) {
		t.Errorf("Commit on a missing base: %v; want NotFound", err)
	}
}
