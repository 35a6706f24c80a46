package cli

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// cpEntry is one entry of a test archive from a "sandbox".
type cpEntry struct {
	name, link, data string
	typ              byte
}

func cpTar(t *testing.T, entries ...cpEntry) *bytes.Reader {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.data))}
		if e.typ == tar.TypeDir {
			hdr.Mode = 0o755
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.data))
	}
	tw.Close()
	return bytes.NewReader(b.Bytes())
}

func TestExtractTarSymlinks(t *testing.T) {
	tests := []struct {
		name        string
		entries     []cpEntry
		wantSkipped []string
		wantErr     string
		wantLinks   map[string]string // kept symlinks
	}{
		{
			name: "absolute and climbing links skipped, in-tree kept",
			entries: []cpEntry{
				{name: "d/", typ: tar.TypeDir},
				{name: "d/f", data: "x", typ: tar.TypeReg},
				{name: "abs", link: "/etc/passwd", typ: tar.TypeSymlink},
				{name: "up", link: "../outside", typ: tar.TypeSymlink},
				{name: "d/up2", link: "../../outside", typ: tar.TypeSymlink},
				{name: "d/in", link: "f", typ: tar.TypeSymlink},
				{name: "in2", link: "d/../d/f", typ: tar.TypeSymlink},
			},
			wantSkipped: []string{"abs -> /etc/passwd", "up -> ../outside", "d/up2 -> ../../outside", "in2 -> d/../d/f"},
			wantLinks:   map[string]string{"d/in": "f"},
		},
		{
			// "s" lexically, but through s/x -> .. (made after it) the
			// destination's parent.
			name: "a chain of links out",
			entries: []cpEntry{
				{name: "l", link: "s/x/..", typ: tar.TypeSymlink},
				{name: "s/x", link: "..", typ: tar.TypeSymlink},
				{name: "d/", typ: tar.TypeDir},
				{name: "d/up", link: "../s", typ: tar.TypeSymlink},
			},
			wantSkipped: []string{"l -> s/x/.."},
			wantLinks:   map[string]string{"s/x": "..", "d/up": "../s"},
		},
		{
			name: "no write through an escaping link of the archive",
			entries: []cpEntry{
				{name: "a", link: "..", typ: tar.TypeSymlink},
				{name: "a/file", data: "pwned", typ: tar.TypeReg},
			},
			wantSkipped: []string{"a -> .."},
		},
		{
			name: "no write through an in-tree link of the archive",
			entries: []cpEntry{
				{name: "b/", typ: tar.TypeDir},
				{name: "a", link: "b", typ: tar.TypeSymlink},
				{name: "a/file", data: "pwned", typ: tar.TypeReg},
			},
			wantErr:   `"a/file": below "a"`,
			wantLinks: map[string]string{"a": "b"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			top := t.TempDir()
			dst := filepath.Join(top, "dst")
			os.Mkdir(dst, 0o755)
			skipped, err := extractTar(cpTar(t, tt.entries...), dst)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("error: got %v, want %q", err, tt.wantErr)
			}
			if !slices.Equal(skipped, tt.wantSkipped) {
				t.Errorf("skipped: got %q, want %q", skipped, tt.wantSkipped)
			}
			// Nothing outside dst; every link inside dst is a wanted one.
			if ents, _ := os.ReadDir(top); len(ents) != 1 {
				t.Errorf("entries next to dst: got %d, want only dst", len(ents))
			}
			filepath.WalkDir(dst, func(p string, d os.DirEntry, err error) error {
				if err != nil || d.Type()&os.ModeSymlink == 0 {
					return err
				}
				rel, _ := filepath.Rel(dst, p)
				target, _ := os.Readlink(p)
				if want, ok := tt.wantLinks[rel]; !ok || want != target {
					t.Errorf("symlink %s -> %s: want %q", rel, target, want)
				}
				return nil
			})
		})
	}
}

// TestExtractTarFileOverLink: a file entry replaces a link of the archive
// instead of writing into its target.
func TestExtractTarFileOverLink(t *testing.T) {
	dst := t.TempDir()
	_, err := extractTar(cpTar(t,
		cpEntry{name: "t", data: "target", typ: tar.TypeReg},
		cpEntry{name: "l", link: "t", typ: tar.TypeSymlink},
		cpEntry{name: "l", data: "new", typ: tar.TypeReg},
	), dst)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "t")); string(b) != "target" {
		t.Errorf("t: got %q, want it untouched", b)
	}
	if fi, err := os.Lstat(filepath.Join(dst, "l")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("l: got %v, %v, want a regular file", fi, err)
	}
}

func TestCpInto(t *testing.T) {
	for _, c := range []struct{ dst, src, want string }{
		{"out", "/root/proj", "out/proj"},
		{"out", "/root/proj/", "out/proj"},
		{"out", "/root/proj/.", "out"},
		{"out", ".", "out"},
		{"out", "/", "out"},
		{"/box/dir", "./local/src", "/box/dir/src"},
	} {
		if got := cpInto(c.dst, c.src, filepath.Join); got != c.want {
			t.Errorf("cpInto(%q, %q): got %q, want %q", c.dst, c.src, got, c.want)
		}
	}
}

// TestWriteTarSwappedAfterWalk: sbx cp of a local directory into a box
// (and a recipe's copy: both read files through openWalked), with a file
// (or a directory above it) swapped for a symlink to a secret outside the
// directory, or to a file inside it the walk left out, between the walk's
// lstat and the read (as a
// cloned repository's scripts or a sandbox sharing the tree could). The
// copy must fail naming the file, and no byte of the secret may reach the
// tar sent to the box.
func TestWriteTarSwappedAfterWalk(t *testing.T) {
	const secret = "SECRET-OUTSIDE-THE-DIRECTORY"
	tests := []struct {
		name string
		rel  string
		swap func(t *testing.T, dir, outside string)
	}{
		{"file replaced by a link", "f", func(t *testing.T, dir, outside string) {
			swapForLink(t, filepath.Join(dir, "f"), filepath.Join(outside, "secret"))
		}},
		{"directory above replaced by a link", "d/secret", func(t *testing.T, dir, outside string) {
			swapForLink(t, filepath.Join(dir, "d"), outside)
		}},
		{"file replaced by a relative link out", "d/secret", func(t *testing.T, dir, outside string) {
			swapForLink(t, filepath.Join(dir, "d", "secret"), "../../outside/secret")
		}},
		// A file of the tree the walk left out (a recipe's .dockerignore,
		// say) read in place of a walked one.
		{"file replaced by a link to another file inside", "f", func(t *testing.T, dir, outside string) {
			if err := os.WriteFile(filepath.Join(dir, ".env"), []byte(secret), 0o600); err != nil {
				t.Fatal(err)
			}
			swapForLink(t, filepath.Join(dir, "f"), ".env")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			dir, outside := filepath.Join(base, "dir"), filepath.Join(base, "outside")
			pad := strings.Repeat("x", len(secret)) // as long as the secret: a size check alone passes
			for p, data := range map[string]string{
				filepath.Join(dir, "f"):           pad,
				filepath.Join(dir, "d", "secret"): pad,
				filepath.Join(outside, "secret"):  secret,
			} {
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			root, err := os.OpenRoot(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			info, err := root.Lstat(tt.rel) // what the walk saw
			if err != nil {
				t.Fatal(err)
			}
			tt.swap(t, dir, outside)
			var b bytes.Buffer
			tw := tar.NewWriter(&b)
			err = writeTarEntry(tw, root, tt.rel, info)
			tw.Flush()
			if err == nil || !strings.Contains(err.Error(), tt.rel) {
				t.Errorf("writeTarEntry: got error %v, want one naming %s", err, tt.rel)
			}
			if bytes.Contains(b.Bytes(), []byte(secret)) {
				t.Errorf("the tar (%d bytes) holds the secret the swapped link leads to", b.Len())
			}
		})
	}
}

func swapForLink(t *testing.T, p, target string) {
	t.Helper()
	if err := os.RemoveAll(p); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

// TestExtractTarLinkThroughExistingLink: sbx cp out of a box into a
// directory that already holds the user's own links (p -> a directory
// outside it). The box's l -> p/x reads as inside on its own; resolved, it
// leads out, so it is not left behind (it is listed as skipped). A link
// through an existing link that stays inside, and a dangling one, are kept.
func TestExtractTarLinkThroughExistingLink(t *testing.T) {
	for _, existing := range []string{"abs", "../outside"} {
		t.Run(existing, func(t *testing.T) {
			top := t.TempDir()
			dst, outside := filepath.Join(top, "dst"), filepath.Join(top, "outside")
			for _, d := range []string{filepath.Join(dst, "in"), outside} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			target := existing
			if existing == "abs" {
				target = outside
			}
			if err := os.Symlink(target, filepath.Join(dst, "p")); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("in", filepath.Join(dst, "q")); err != nil {
				t.Fatal(err)
			}
			skipped, err := extractTar(cpTar(t,
				cpEntry{name: "l", link: "p/x", typ: tar.TypeSymlink},
				cpEntry{name: "m", link: "q/y", typ: tar.TypeSymlink},
				cpEntry{name: "in/y", data: "y", typ: tar.TypeReg},
				cpEntry{name: "dangling", link: "nothing/here", typ: tar.TypeSymlink},
			), dst)
			if err != nil {
				t.Fatal(err)
			}
			if want := []string{"l -> p/x"}; !slices.Equal(skipped, want) {
				t.Errorf("skipped: got %q, want %q", skipped, want)
			}
			if _, err := os.Lstat(filepath.Join(dst, "l")); !os.IsNotExist(err) {
				t.Errorf("l: got %v, want it removed", err)
			}
			for _, n := range []string{"m", "dangling"} {
				if _, err := os.Readlink(filepath.Join(dst, n)); err != nil {
					t.Errorf("%s: got %v, want the link kept", n, err)
				}
			}
		})
	}
}
