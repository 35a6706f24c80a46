package image

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/testutil"
)

// FuzzExtractLayer feeds the layer extractor hostile tars (see
// testutil.TarFromScript). Whatever the layer holds, nothing is written,
// linked or changed outside the layer directory; file data stays within
// the byte budget; every file and directory is owned by a shifted id and
// no file keeps setuid or setgid; a layer refused for its content says
// InvalidArgument (a malformed header was an unmarked error before).
func FuzzExtractLayer(f *testing.F) {
	testutil.RequiresRoot(f)
	for _, s := range testutil.FuzzTarSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, script []byte) {
		j := testutil.NewJail(t)
		const maxBytes = 1 << 20
		opt := extractOptions{UIDShift: testShift, IDRange: 65536, MaxBytes: maxBytes, MaxEntries: 1000}
		data := testutil.TarFromScript(script, j.Out)
		_, err := extractLayer(context.Background(), bytes.NewReader(data), j.Dest, opt)
		if total := j.Check(t); total > maxBytes {
			t.Fatalf("%d bytes of files from a layer allowed %d", total, maxBytes)
		}
		if err != nil {
			// A cut archive may be the network's doing: not InvalidArgument.
			if !errors.Is(err, errdefs.ErrInvalidArgument) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("extract: %v, not InvalidArgument", err)
			}
			return
		}
		_ = filepath.WalkDir(j.Dest, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				t.Fatalf("walk: %v", err)
			}
			fi, err := d.Info()
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if st.Uid < testShift || st.Uid >= testShift+65536 || st.Gid < testShift || st.Gid >= testShift+65536 {
				t.Fatalf("%s owned by %d:%d, outside the shifted range", p, st.Uid, st.Gid)
			}
			if fi.Mode().IsRegular() && fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
				t.Fatalf("%s kept mode %v", p, fi.Mode())
			}
			if fi.Mode()&fs.ModeDevice != 0 && fi.Sys().(*syscall.Stat_t).Rdev != 0 {
				t.Fatalf("%s is a device other than a whiteout", p)
			}
			return nil
		})
		_ = os.RemoveAll(j.Dest)
	})
}
