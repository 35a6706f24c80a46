package ocibox

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"io"
	"testing"
	"time"
)

// FuzzSparseTar: the GNU sparse 1.0 entries Diff writes for a box's sparse
// files read back through archive/tar as exactly the file (data where the
// fragments are, zeros in the holes, the real size); and shrinkFragments
// keeps every byte of data inside its fewer fragments.
func FuzzSparseTar(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 0, 0, 1, 0}, uint16(3), uint8(1))
	f.Add([]byte{1, 0, 2, 0, 0, 0, 3, 0, 200, 0, 0, 1}, uint16(0), uint8(2))
	f.Fuzz(func(t *testing.T, spec []byte, tail uint16, target uint8) {
		// spec: pairs of (gap, length) as little-endian uint16s.
		var frags []fragment
		var off int64
		for i := 0; i+4 <= len(spec) && len(frags) < 64; i += 4 {
			gap, n := int64(binary.LittleEndian.Uint16(spec[i:])), int64(binary.LittleEndian.Uint16(spec[i+2:]))
			if n == 0 {
				n = 1
			}
			off += gap
			frags = append(frags, fragment{off, n})
			off += n
		}
		if len(frags) == 0 {
			return
		}
		size := off + int64(tail)
		want := make([]byte, size)
		for i, fr := range frags {
			for k := fr.off; k < fr.off+fr.n; k++ {
				want[k] = byte(i + 1)
			}
		}
		tgt := max(1, int(target))
		shrunk := shrinkFragments(append([]fragment(nil), frags...), tgt)
		if len(shrunk) > tgt && len(frags) > tgt {
			t.Fatalf("shrink to %d left %d fragments", tgt, len(shrunk))
		}
		for _, fr := range frags {
			covered := false
			for _, s := range shrunk {
				covered = covered || s.off <= fr.off && fr.off+fr.n <= s.off+s.n
			}
			if !covered {
				t.Fatalf("fragment %v lost by shrinking to %v", fr, shrunk)
			}
		}
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		hdr := &tar.Header{Name: "d/sparse", Mode: 0o644, Size: size, ModTime: time.Unix(1700000000, 0)}
		m, err := writeSparseHeader(tw, &buf, hdr, frags)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(m); err != nil {
			t.Fatal(err)
		}
		for _, fr := range frags {
			if _, err := tw.Write(want[fr.off : fr.off+fr.n]); err != nil {
				t.Fatal(err)
			}
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(&buf)
		got, err := tr.Next()
		if err != nil {
			t.Fatalf("reading back: %v", err)
		}
		if got.Name != hdr.Name || got.Size != size {
			t.Fatalf("read back %q of %d bytes, want %q of %d", got.Name, got.Size, hdr.Name, size)
		}
		data, err := io.ReadAll(tr)
		if err != nil || !bytes.Equal(data, want) {
			t.Fatalf("content differs (%v)", err)
		}
	})
}
