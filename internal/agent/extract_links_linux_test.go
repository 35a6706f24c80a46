package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/testutil"
)

// TestExtractTarChainOfLinks extracts archives whose symlinks each read as
// inside the destination alone but lead out of it together ("l -> s/x/.."
// with "s/x -> .."): the upload fails naming the link, which is not left
// behind. Chains that stay inside are kept.
func TestExtractTarChainOfLinks(t *testing.T) {
	testutil.RequiresRoot(t)
	bfs, err := newBoxFS()
	if err != nil {
		t.Fatal(err)
	}
	type entry struct {
		name, link string
		hard       bool // a hard link (to link), not a symlink
	}
	tests := []struct {
		name    string
		entries []entry
		wantErr string   // "" for success
		gone    []string // links that must not exist afterwards
		kept    []string // links that must exist afterwards
	}{
		{
			name:    "link made before the link it climbs through",
			entries: []entry{{name: "l", link: "s/x/.."}, {name: "s/x", link: ".."}},
			wantErr: `tar entry "l"`,
			gone:    []string{"l"},
		},
		{
			name:    "link made after the link it climbs through",
			entries: []entry{{name: "s/x", link: ".."}, {name: "l", link: "s/x/.."}},
			wantErr: `tar entry "l"`,
			gone:    []string{"l"},
		},
		{
			name:    "two hops then up",
			entries: []entry{{name: "a/b", link: "../c/d"}, {name: "c/d", link: ".."}, {name: "l", link: "a/b/../../etc"}},
			wantErr: `tar entry "l"`,
			gone:    []string{"l"},
		},
		{
			name:    "hard link to a link that leads out",
			entries: []entry{{name: "l", link: "s/x/.."}, {name: "h", link: "l", hard: true}, {name: "s/x", link: ".."}},
			wantErr: `tar entry "`,
			gone:    []string{"l", "h"},
		},
		{
			name:    "chain that stays inside",
			entries: []entry{{name: "s/x", link: "../t"}, {name: "t/y", link: "."}, {name: "l", link: "s/x/y/.."}},
			kept:    []string{"s/x", "t/y", "l"},
		},
		{
			name:    "dangling link",
			entries: []entry{{name: "d/l", link: "missing/file"}},
			kept:    []string{"d/l"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parent := t.TempDir()
			dest := filepath.Join(parent, "dest")
			if err := os.Mkdir(dest, 0o755); err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			tw := tar.NewWriter(&b)
			for _, e := range tt.entries {
				typ := byte(tar.TypeSymlink)
				if e.hard {
					typ = tar.TypeLink
				}
				if err := tw.WriteHeader(&tar.Header{Name: e.name, Linkname: e.link, Typeflag: typ, Mode: 0o777}); err != nil {
					t.Fatal(err)
				}
			}
			tw.Close()
			fd, err := unix.Open(dest, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			_, _, err = extractTar(context.Background(), bfs, nil, fd, &b)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("extract: got %v, want success", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("extract: got error %v, want one containing %q", err, tt.wantErr)
			}
			for _, n := range tt.gone {
				if target, err := os.Readlink(filepath.Join(dest, n)); err == nil {
					t.Errorf("%s -> %s: exists, want it removed", n, target)
				}
			}
			for _, n := range tt.kept {
				if _, err := os.Readlink(filepath.Join(dest, n)); err != nil {
					t.Errorf("%s: got %v, want the link kept", n, err)
				}
			}
			assertNoLinkLeaves(t, dest)
		})
	}
}

// assertNoLinkLeaves fails if any symlink under dest, resolved by the
// kernel, leads out of dest (what a lexical reading of one target misses).
func assertNoLinkLeaves(t *testing.T, dest string) {
	t.Helper()
	err := filepath.WalkDir(dest, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.Type()&os.ModeSymlink == 0 {
			return err
		}
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			return nil // dangling
		}
		if real != dest && !strings.HasPrefix(real, dest+"/") {
			target, _ := os.Readlink(p)
			t.Errorf("%s -> %s resolves to %s, outside the destination %s", p, target, real, dest)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
