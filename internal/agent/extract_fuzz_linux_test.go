package agent

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/testutil"
)

// FuzzExtractTar feeds the agent's UploadTar extractor hostile archives
// (see testutil.TarFromScript). Nothing is written, linked or changed
// outside the destination; no symlink it made resolves outside it; no device
// is made and no file keeps setuid or setgid.
func FuzzExtractTar(f *testing.F) {
	testutil.RequiresRoot(f)
	for _, s := range testutil.FuzzTarSeeds {
		f.Add([]byte(s))
	}
	bfs, err := newBoxFS()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, script []byte) {
		j := testutil.NewJail(t)
		fd, err := unix.Open(j.Dest, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		_, _, _ = extractTar(context.Background(), bfs, nil, fd, bytes.NewReader(testutil.TarFromScript(script, j.Out)))
		j.Check(t)
		assertNoLinkLeaves(t, j.Dest)
		_ = filepath.WalkDir(j.Dest, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				t.Fatalf("walk: %v", err)
			}
			fi, err := d.Info()
			if err != nil {
				t.Fatal(err)
			}
			rel, _ := filepath.Rel(j.Dest, p)
			switch m := fi.Mode(); {
			case m&fs.ModeDevice != 0:
				t.Fatalf("%s is a device", rel)
			case m&(fs.ModeSetuid|fs.ModeSetgid) != 0:
				t.Fatalf("%s kept mode %v", rel, m)
			}
			return nil
		})
		_ = os.RemoveAll(j.Dest)
	})
}
