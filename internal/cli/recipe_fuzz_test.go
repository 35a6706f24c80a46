package cli

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParseRecipe feeds the recipe parser YAML files. It never panics; an
// accepted recipe has a base and one step per list entry, and a copy step
// packs only what lies inside the build context (the context holds a
// symlink to a directory outside it, whose file must never be read).
func FuzzParseRecipe(f *testing.F) {
	for _, s := range []string{
		"from: debian:bookworm\nsteps:\n  - apt_install: [python3, python3-pip]\n  - run: make install\n  - env: {APP_ENV: prod}\n",
		"from: x\nsteps:\n  - copy: {src: ./app, dest: /app}\n  - copy: {src: app/main.py, dest: /srv}\n",
		"from: x\nsteps:\n  - copy: {src: out, dest: /o}\n",
		"from: x\nsteps:\n  - copy: {src: app/out/secret, dest: /o}\n",
		"from: &a x\nsteps: [*a, *a]\n",
		"from: x\nsteps:\n  - cmd: [a, b]\n    user: y\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// Per input: a fuzzing worker is killed at the end without running
		// the F's cleanups.
		ctx := buildContextDir(t)
		r, err := parseRecipe(data, ctx)
		if err != nil {
			return
		}
		if r.GetFrom() == "" {
			t.Fatalf("accepted a recipe without a base")
		}
		for i, s := range r.GetSteps() {
			if s.GetStep() == nil {
				t.Fatalf("step %d is empty", i+1)
			}
			c := s.GetCopy()
			if c == nil {
				continue
			}
			tr := tar.NewReader(bytes.NewReader(c.GetTar()))
			for {
				hdr, err := tr.Next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatalf("step %d: copy tar does not read back: %v", i+1, err)
				}
				b, _ := io.ReadAll(tr)
				if bytes.Contains(b, []byte("outside-secret")) || hdr.Typeflag == tar.TypeSymlink && strings.HasPrefix(hdr.Linkname, "/") {
					t.Fatalf("step %d: copy took %q (-> %q) from outside the context", i+1, hdr.Name, hdr.Linkname)
				}
			}
		}
	})
}

// buildContextDir makes a build context with app/main.py and symlinks to a
// directory outside it holding the file "secret".
func buildContextDir(t *testing.T) string {
	t.Helper()
	outside, ctx := t.TempDir(), t.TempDir()
	for _, err := range []error{
		os.WriteFile(filepath.Join(outside, "secret"), []byte("outside-secret"), 0o600),
		os.MkdirAll(filepath.Join(ctx, "app"), 0o755),
		os.WriteFile(filepath.Join(ctx, "app", "main.py"), []byte("print(1)\n"), 0o644),
		os.Symlink(outside, filepath.Join(ctx, "out")),
		os.Symlink(outside, filepath.Join(ctx, "app", "out")),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return ctx
}
