//go:build linux

package ocibox

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/safepath"
)

// diffDir runs the snapshot writer over dir (standing in for a box's upper
// dir) and returns the tar it wrote.
func diffDir(t *testing.T, dir string, lim runtime.DiffLimits) ([]byte, error) {
	t.Helper()
	root, err := safepath.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	var buf bytes.Buffer
	dw := newDiffWriter(context.Background(), root, &buf, "sb-test", lim)
	if err := root.Walk(".", dw.visit); err != nil {
		return nil, err
	}
	if err := dw.tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), nil
}

// sparseFile makes a file of size bytes holding data at each offset and
// returns the hash of its contents.
func sparseFile(t *testing.T, p string, size int64, data []byte, offs ...int64) [32]byte {
	t.Helper()
	f := mkSparse(t, p, size, data, offs...)
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}

// mkSparse makes a file of size bytes holding data at each offset and
// returns it open.
func mkSparse(t *testing.T, p string, size int64, data []byte, offs ...int64) *os.File {
	t.Helper()
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for _, o := range offs {
		if _, err := f.WriteAt(data, o); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

type tarFile struct {
	size  int64
	mtime time.Time
	sum   [32]byte
	typ   byte
	link  string
}

// readTar reads every entry of a layer tar back with archive/tar.
func readTar(t *testing.T, b []byte) map[string]tarFile {
	t.Helper()
	out := map[string]tarFile{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("reading the tar back: %v", err)
		}
		h := sha256.New()
		n, err := io.Copy(h, tr)
		if err != nil {
			t.Fatalf("reading %s back: %v", hdr.Name, err)
		}
		if n != hdr.Size && hdr.Typeflag == tar.TypeReg {
			t.Errorf("%s: read %d bytes, header says %d", hdr.Name, n, hdr.Size)
		}
		out[hdr.Name] = tarFile{size: hdr.Size, mtime: hdr.ModTime, sum: [32]byte(h.Sum(nil)), typ: hdr.Typeflag, link: hdr.Linkname}
	}
}

func TestDiffSparseFiles(t *testing.T) {
	dir := t.TempDir()
	data := bytes.Repeat([]byte("d"), 5000)
	const big = 256 << 20
	sums := map[string][32]byte{
		"big":       sparseFile(t, filepath.Join(dir, "big"), big, data, 0, 100<<20, big-5000),
		"holeonly":  sparseFile(t, filepath.Join(dir, "holeonly"), 64<<20, nil),
		"dense":     sparseFile(t, filepath.Join(dir, "dense"), 5000, data, 0),
		"tailhole":  sparseFile(t, filepath.Join(dir, "tailhole"), 32<<20, data, 1<<20),
		"empty":     sparseFile(t, filepath.Join(dir, "empty"), 0, nil),
		"long-name": sparseFile(t, filepath.Join(dir, strings.Repeat("n", 200)), 16<<20, data, 8<<20),
	}
	sums[strings.Repeat("n", 200)] = sums["long-name"]
	delete(sums, "long-name")
	// Names and times a ustar header cannot hold travel in our PAX header.
	odd := "new\nline=\xff \u00e9"
	sums[odd] = sparseFile(t, filepath.Join(dir, odd), 8<<20, data, 4<<20)
	old := time.Date(1950, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(dir, odd), old, old); err != nil {
		t.Fatal(err)
	}
	// More data segments than a sparse map may hold (lowered for the
	// test): the shortest holes are merged into data, and only those.
	defer func(n int) { maxFragments = n }(maxFragments)
	maxFragments = 512
	f, err := os.Create(filepath.Join(dir, "fragmented"))
	if err != nil {
		t.Fatal(err)
	}
	const pairs = 300 // two pages 4 KiB apart, then 1 MiB of hole
	for i := int64(0); i < pairs; i++ {
		for _, off := range []int64{i << 20, i<<20 + 8<<10} {
			if _, err := f.WriteAt([]byte{byte(i) | 1}, off); err != nil {
				t.Fatal(err)
			}
		}
	}
	f.Close()
	sums["fragmented"] = sparseFile(t, filepath.Join(dir, "fragmented"), pairs<<20, nil)

	b, err := diffDir(t, dir, runtime.DiffLimits{DataBytes: 256 << 20, ApparentBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	// Holes are not in the stream: 256 MiB + 64 MiB + ... of holes, a few
	// KiB of data, the fragmented file's 600 blocks of data and the 4 KiB
	// holes merged between some of them (not its 1 MiB holes).
	if len(b) > 4<<20 {
		t.Errorf("layer tar is %d bytes; want holes left out (< 4 MiB)", len(b))
	}
	got := readTar(t, b)
	if g := got[odd]; !g.mtime.Equal(old) {
		t.Errorf("%q: mtime %v, want %v", odd, g.mtime, old)
	}
	for name, sum := range sums {
		fi, _ := os.Stat(filepath.Join(dir, name))
		if g, ok := got[name]; !ok || g.size != fi.Size() || g.sum != sum {
			t.Errorf("%s: got size %d (found %v), content equal %v; want size %d and equal content", name, g.size, ok, g.sum == sum, fi.Size())
		}
	}

	// GNU tar reads the sparse entries too, and keeps their holes.
	if _, err := exec.LookPath("tar"); err == nil {
		out := t.TempDir()
		cmd := exec.Command("tar", "-x", "-C", out)
		cmd.Stdin = bytes.NewReader(b)
		if msg, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("GNU tar: %v: %s", err, msg)
		}
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(out, "big"), &st); err != nil || st.Size != big || st.Blocks*512 > 1<<20 {
			t.Errorf("GNU tar extracted big: %v, size %d, %d bytes allocated; want %d, sparse", err, st.Size, st.Blocks*512, big)
		}
		if s := sparseFile(t, filepath.Join(out, "fragmented"), pairs<<20, nil); s != sums["fragmented"] {
			t.Error("GNU tar extracted fragmented with other contents")
		}
	}
}

func TestDiffLimits(t *testing.T) {
	tests := []struct {
		name    string
		files   func(dir string)
		lim     runtime.DiffLimits
		wantErr string // "" = success
	}{
		{
			name: "data past the disk limit",
			files: func(dir string) {
				mkSparse(t, filepath.Join(dir, "a"), 3<<20, bytes.Repeat([]byte{1}, 3<<20), 0).Close()
			},
			lim:     runtime.DiffLimits{DataBytes: 1 << 20, DataWhat: "sandbox sb-x's disk limit (1MiB)"},
			wantErr: "sandbox sb-x's disk limit (1MiB)",
		},
		{
			name: "holes do not count as data",
			files: func(dir string) {
				mkSparse(t, filepath.Join(dir, "a"), 1<<30, []byte("x"), 0, 1<<29).Close()
			},
			lim: runtime.DiffLimits{DataBytes: 1 << 20, ApparentBytes: 2 << 30},
		},
		{
			name: "apparent size past the cap",
			files: func(dir string) {
				for _, n := range []string{"a", "b", "c"} {
					mkSparse(t, filepath.Join(dir, n), 1<<30, []byte("x"), 0).Close()
				}
			},
			lim:     runtime.DiffLimits{DataBytes: 1 << 20, ApparentBytes: 2 << 30, ApparentWhat: "the daemon's largest layer"},
			wantErr: "the daemon's largest layer",
		},
		{
			name: "a hard link counts once",
			files: func(dir string) {
				mkSparse(t, filepath.Join(dir, "a"), 600<<10, bytes.Repeat([]byte{1}, 600<<10), 0).Close()
				if err := os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "b")); err != nil {
					t.Fatal(err)
				}
			},
			lim: runtime.DiffLimits{DataBytes: 1 << 20},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tt.files(dir)
			_, err := diffDir(t, dir, tt.lim)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("got %v, want success", err)
			case tt.wantErr != "" && (!errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("got %v, want ResourceExhausted naming %q", err, tt.wantErr)
			}
		})
	}
}

// TestDiffNeverFollows: symlinks in the upper dir (to "/", to a host dir,
// to /proc/self/fd) are captured as symlinks; nothing behind them is read.
func TestDiffNeverFollows(t *testing.T) {
	dir, host := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "secret"), []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"root": "/", "hostdir": host, "fd": "/proc/self/fd/0", "etc": "/etc"} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	b, err := diffDir(t, dir, runtime.DiffLimits{})
	if err != nil {
		t.Fatal(err)
	}
	got := readTar(t, b)
	if len(got) != 4 {
		t.Errorf("got entries %v; want the 4 symlinks alone", got)
	}
	for name, g := range got {
		if g.typ != tar.TypeSymlink {
			t.Errorf("%s: type %c, want a symlink", name, g.typ)
		}
	}
	if bytes.Contains(b, []byte("host secret")) {
		t.Error("the layer holds a host file's contents")
	}
}
