//go:build linux

package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// gnuSparseTar has GNU tar write dir's files as PAX GNU sparse 1.0
// entries (what snapshots write for files with holes).
func gnuSparseTar(t *testing.T, dir string, names ...string) []byte {
	t.Helper()
	if _, err := exec.LookPath("tar"); err != nil {
		t.Skip("no tar binary")
	}
	args := append([]string{"--sparse", "--format=posix", "--sparse-version=1.0", "-c", "-f", "-", "-C", dir}, names...)
	out, err := exec.Command("tar", args...).Output()
	if err != nil {
		t.Fatalf("tar: %v", err)
	}
	return out
}

func allocated(t *testing.T, p string) (size, alloc int64) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Size, st.Blocks * 512
}

// TestExtractKeepsHoles: a sparse entry's holes and a dense entry's runs of
// zeros stay holes on the host, and the contents are intact.
func TestExtractKeepsHoles(t *testing.T) {
	src := t.TempDir()
	f, err := os.Create(filepath.Join(src, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	const size = 1 << 30
	for _, off := range []int64{0, 300 << 20, size - 4} {
		if _, err := f.WriteAt([]byte("data"), off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	sparse := gnuSparseTar(t, src, "sparse")
	// Zeros written out: 8 MiB of them between data, and a zero tail.
	dense := append(append([]byte("head"), make([]byte, 8<<20)...), []byte("tail")...)
	dense = append(dense, make([]byte, 1<<20)...)
	plain := tarOf(t, file("dense", string(dense)))

	tests := []struct {
		name   string
		tar    []byte
		file   string
		size   int64
		checks map[int64]string
	}{
		{"GNU sparse 1.0 entry", sparse, "sparse", size, map[int64]string{0: "data", 300 << 20: "data", size - 4: "data", 4096: "\x00\x00\x00\x00"}},
		{"zeros in a plain entry", plain, "dense", int64(len(dense)), map[int64]string{0: "head", 4 + 8<<20: "tail", int64(len(dense)) - 4: "\x00\x00\x00\x00"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			layer, st, err := extractT(t, tt.tar, extractOptions{MaxBytes: 2 << 30})
			if err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(layer, tt.file)
			gotSize, alloc := allocated(t, p)
			if gotSize != tt.size || alloc > 256<<10 {
				t.Errorf("%s: size %d, %d bytes allocated; want size %d and holes (≤ 256 KiB)", tt.file, gotSize, alloc, tt.size)
			}
			if st.Bytes != tt.size || st.Written > 64<<10 {
				t.Errorf("stats: read %d, written %d; want read %d and little written", st.Bytes, st.Written, tt.size)
			}
			f, err := os.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for off, want := range tt.checks {
				got := make([]byte, len(want))
				if _, err := f.ReadAt(got, off); err != nil || string(got) != want {
					t.Errorf("at %d: %q (%v), want %q", off, got, err, want)
				}
			}
		})
	}
}

// TestExtractSparseBombRejected: a sparse entry claims a size far past
// MaxBytes with next to no data in the stream; its holes count as the
// contents they stand for and the layer is rejected (a layer cannot make
// the host spend unbounded time writing, or reading, zeros).
func TestExtractSparseBombRejected(t *testing.T) {
	src := t.TempDir()
	f, err := os.Create(filepath.Join(src, "bomb"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 40); err != nil { // 1 TiB of holes
		t.Fatal(err)
	}
	f.Close()
	data := gnuSparseTar(t, src, "bomb")
	if len(data) > 64<<10 {
		t.Fatalf("the bomb's tar is %d bytes; want a small one", len(data))
	}
	// archive/tar reads it as a 1 TiB regular file.
	if hdr, err := tar.NewReader(bytes.NewReader(data)).Next(); err != nil || hdr.Size != 1<<40 {
		t.Fatalf("tar reads %v, %v", hdr, err)
	}
	layer, st, err := extractT(t, data, extractOptions{MaxBytes: 64 << 20})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || st.Bytes > 65<<20 {
		t.Fatalf("got %v after %d bytes; want a rejection at 64 MiB", err, st.Bytes)
	}
	if _, alloc := allocated(t, filepath.Join(layer, "bomb")); alloc > 1<<20 {
		t.Errorf("the rejected bomb allocated %d bytes", alloc)
	}
}

// TestCommitSparseLayerPrune: a committed layer with a 1 GiB sparse file
// (and a symlink to a host dir) takes next to nothing on the host; Prune
// reports the blocks it freed, not the file's size, and never follows the
// symlink.
func TestCommitSparseLayerPrune(t *testing.T) {
	ctx := t.Context()
	s := openStore(t, t.TempDir())
	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "keep"), bytes.Repeat([]byte("k"), 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	f, err := os.Create(filepath.Join(src, "big"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("end"), 1<<30-3); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Symlink(host, filepath.Join(src, "hostdir")); err != nil {
		t.Fatal(err)
	}
	img, err := s.Commit(ctx, "", bytes.NewReader(gnuSparseTar(t, src, "big", "hostdir")), ImageConfig{}, "local/sparse:1")
	if err != nil {
		t.Fatal(err)
	}
	if size, alloc := allocated(t, filepath.Join(img.Layers[0], "big")); size != 1<<30 || alloc > 64<<10 {
		t.Errorf("committed big: size %d, %d bytes allocated; want 1 GiB, sparse", size, alloc)
	}
	if err := s.Remove(ctx, img.Digest); err != nil {
		t.Fatal(err)
	}
	freed, err := s.Prune(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if freed <= 0 || freed > 1<<20 {
		t.Errorf("Prune freed %d bytes; want the layer's few blocks (not the sparse file's 1 GiB, nor the host dir's 1 MiB)", freed)
	}
	if b, err := os.ReadFile(filepath.Join(host, "keep")); err != nil || len(b) != 1<<20 {
		t.Errorf("host file behind the layer's symlink: %d bytes, %v", len(b), err)
	}
}
