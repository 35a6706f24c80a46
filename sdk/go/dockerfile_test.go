package sbx

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPackContextDockerignore(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		".dockerignore":            "# build junk\nnode_modules\n**/*.pyc\n/secret.env\ndocs/*\n!docs/keep.md\n",
		"app.py":                   "x",
		"node_modules/pkg/i.js":    "x",
		"src/mod.pyc":              "x",
		"src/deep/more/x.pyc":      "x",
		"src/mod.py":               "x",
		"secret.env":               "TOKEN=1",
		"docs/a.md":                "x",
		"docs/keep.md":             "x",
		"sub/secret.env":           "kept: only the root one is listed",
		"sub/node_modules/kept.js": "x: node_modules is anchored at the root",
	} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "passwd-link")); err != nil {
		t.Fatal(err)
	}
	data, err := PackContext(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		n := h.Name
		if h.Typeflag == tar.TypeSymlink {
			n += " -> " + h.Linkname
		}
		if h.Typeflag == tar.TypeReg || h.Typeflag == tar.TypeSymlink {
			got = append(got, n)
		}
	}
	slices.Sort(got)
	want := []string{".dockerignore", "app.py", "docs/keep.md", "passwd-link -> /etc/passwd", "src/mod.py",
		"sub/node_modules/kept.js", "sub/secret.env"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("packed context (-want +got):\n%s", diff)
	}
}
