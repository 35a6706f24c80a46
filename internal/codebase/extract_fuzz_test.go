package codebase

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/testutil"
)

// FuzzExtractTree feeds the codebase extractor hostile uploads (see
// testutil.TarFromScript). Nothing is written, linked or changed outside
// the upload directory; file data stays within the budget; everything is
// owned by the given owner, no file is setuid/setgid and no device or FIFO
// is made; a refused upload says InvalidArgument and the reported totals
// match the tree.
func FuzzExtractTree(f *testing.F) {
	testutil.RequiresRoot(f)
	for _, s := range testutil.FuzzTarSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, script []byte) {
		j := testutil.NewJail(t)
		const maxBytes, uid = 1 << 20, 4242
		opt := extractOpts{uid: uid, gid: uid, maxBytes: maxBytes, maxEntries: 1000, maxFileBytes: 1 << 19,
			skip: func(string, int64, string) {}, log: slog.New(slog.DiscardHandler)}
		st, err := extractTree(context.Background(), bytes.NewReader(testutil.TarFromScript(script, j.Out)), j.Dest, opt)
		if total := j.Check(t); total > maxBytes {
			t.Fatalf("%d bytes of files from an upload allowed %d", total, maxBytes)
		}
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("extract: %v, not InvalidArgument", err)
			}
			return
		}
		var files int64
		_ = filepath.WalkDir(j.Dest, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				t.Fatalf("walk: %v", err)
			}
			fi, err := d.Info()
			if err != nil {
				t.Fatal(err)
			}
			sys := fi.Sys().(*syscall.Stat_t)
			if sys.Uid != uid || sys.Gid != uid {
				t.Fatalf("%s owned by %d:%d, want %d", p, sys.Uid, sys.Gid, uid)
			}
			switch m := fi.Mode(); {
			case m.IsRegular():
				files++
				if m&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
					t.Fatalf("%s kept mode %v", p, m)
				}
			case m.IsDir(), m&fs.ModeSymlink != 0:
			default:
				t.Fatalf("%s has mode %v", p, m)
			}
			return nil
		})
		if files != st.Files {
			t.Fatalf("reported %d files, the tree has %d", st.Files, files)
		}
		_ = os.RemoveAll(j.Dest)
	})
}
