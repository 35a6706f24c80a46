package boxcopy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbxdev/sbx/internal/errdefs"
	"golang.org/x/sys/unix"
)

func allocated(t *testing.T, f *os.File) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

func TestCopyFileKeepsHolesAndCountsBytes(t *testing.T) {
	dir := t.TempDir()
	src, err := os.Create(filepath.Join(dir, "src"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	const size = 2 << 30 // 2 GiB apparent
	data := bytes.Repeat([]byte("x"), 5000)
	for _, off := range []int64{0, 1 << 30, size - 5000} {
		if _, err := src.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
	// A run of allocated zeros is not copied either.
	if _, err := src.WriteAt(make([]byte, 1<<20), 100<<20); err != nil {
		t.Fatal(err)
	}
	dst, err := os.Create(filepath.Join(dir, "dst"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	b := NewBudget(1<<20, "the test's limit")
	n, err := CopyFile(dst, src, b)
	if err != nil {
		t.Fatal(err)
	}
	// Data segments come in file-system blocks: 3 × 5000 bytes written
	// are 3 × 8 KiB here, not the 2 GiB the file says it holds.
	if n < 3*5000 || n > 3*16<<10 || b.Used() != n {
		t.Errorf("written %d, budget used %d; want about %d", n, b.Used(), 3*5000)
	}
	fi, _ := dst.Stat()
	if fi.Size() != size {
		t.Errorf("copy size %d, want %d", fi.Size(), size)
	}
	if a := allocated(t, dst); a > 1<<20 {
		t.Errorf("copy allocates %d bytes on the host, want holes kept (≤ 1 MiB)", a)
	}
	for _, off := range []int64{0, 1 << 30, size - 5000} {
		got := make([]byte, 5000)
		if _, err := dst.ReadAt(got, off); err != nil || !bytes.Equal(got, data) {
			t.Errorf("data at %d lost: %v", off, err)
		}
	}
}

func TestCopyFileStopsAtBudget(t *testing.T) {
	dir := t.TempDir()
	src, _ := os.Create(filepath.Join(dir, "src"))
	defer src.Close()
	if _, err := src.Write(bytes.Repeat([]byte{1}, 3<<20)); err != nil {
		t.Fatal(err)
	}
	dst, _ := os.Create(filepath.Join(dir, "dst"))
	defer dst.Close()
	_, err := CopyFile(dst, src, NewBudget(1<<20, "sandbox x's disk limit"))
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("err = %v, want ResourceExhausted", err)
	}
	if a := allocated(t, dst); a > 1<<20+blockSize {
		t.Errorf("copy went on past its budget: %d bytes allocated", a)
	}
}

func TestZero(t *testing.T) {
	if !Zero(make([]byte, 200000)) || Zero(append(make([]byte, 150000), 1)) || !Zero(nil) {
		t.Error("Zero is wrong")
	}
}

func TestWriteFromSkipsZeros(t *testing.T) {
	dst, err := os.Create(filepath.Join(t.TempDir(), "dst"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	// 256 MiB of zeros with a little data in the middle and at the end.
	r := io.MultiReader(io.LimitReader(zeroReader{}, 128<<20), strings.NewReader("middle"),
		io.LimitReader(zeroReader{}, 128<<20), strings.NewReader("end"))
	n, err := WriteFrom(dst, r, nil)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := dst.Stat()
	if want := int64(256<<20 + 9); fi.Size() != want {
		t.Errorf("size %d, want %d", fi.Size(), want)
	}
	if n > 2*blockSize || allocated(t, dst) > 1<<20 {
		t.Errorf("wrote %d bytes, allocated %d: zeros were not skipped", n, allocated(t, dst))
	}
	got := make([]byte, 3)
	if _, err := dst.ReadAt(got, fi.Size()-3); err != nil || string(got) != "end" {
		t.Errorf("tail %q, %v", got, err)
	}
	if _, err := WriteFrom(dst, strings.NewReader("x"), NewBudget(0, "nothing")); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("over budget: %v", err)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TestWriteFromRuns: data and zero blocks mixed in every way within and
// across reads come out byte for byte, with holes where blocks of zeros
// were and every other byte counted once against the budget.
func TestWriteFromRuns(t *testing.T) {
	block := func(fill byte) []byte { return bytes.Repeat([]byte{fill}, blockSize) }
	z, d := block(0), block('d')
	for _, tc := range []struct {
		name  string
		parts [][]byte
	}{
		{"data only", [][]byte{d, d, d}},
		{"zeros between", [][]byte{d, z, z, d}},
		{"a run across reads", [][]byte{bytes.Repeat(d, 20), z, d}},
		{"zeros across reads", [][]byte{d, bytes.Repeat(z, 20), d}},
		{"short tail", [][]byte{z, d[:100]}},
		{"zero tail", [][]byte{d, z[:100]}},
		{"a byte in a zero block", [][]byte{z, append(append([]byte{}, z[:blockSize-1]...), 1), z}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := bytes.Join(tc.parts, nil)
			dst, err := os.Create(filepath.Join(t.TempDir(), "dst"))
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Close()
			b := NewBudget(1<<40, "test")
			n, err := WriteFrom(dst, bytes.NewReader(want), b)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(dst.Name())
			if !bytes.Equal(got, want) {
				t.Fatalf("got %d bytes, want the %d read, byte for byte", len(got), len(want))
			}
			var nonZero int64
			for i := 0; i < len(want); i += blockSize {
				if blk := want[i:min(i+blockSize, len(want))]; !Zero(blk) {
					nonZero += int64(len(blk))
				}
			}
			if n != nonZero || b.Used() != nonZero {
				t.Errorf("written %d, budget used %d; want %d (the blocks that are not all zeros)", n, b.Used(), nonZero)
			}
		})
	}
}
