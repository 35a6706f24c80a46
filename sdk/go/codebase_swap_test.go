package sbx

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWriteCodebaseTarSwappedDuringWalk walks a directory, then (as
// whoever else shapes it could, between the walk and the read) swaps a
// walked file, or a walked directory, for a symlink to a secret outside
// it. The upload must fail naming the file, and no byte of the secret may
// reach the tar.
func TestWriteCodebaseTarSwappedDuringWalk(t *testing.T) {
	const secret = "SECRET-OUTSIDE-THE-CODEBASE"
	tests := []struct {
		name string
		swap func(t *testing.T, dir, outside string)
	}{
		{"file replaced by a link", func(t *testing.T, dir, outside string) {
			replaceWithLink(t, filepath.Join(dir, "f"), filepath.Join(outside, "secret"))
		}},
		{"directory replaced by a link", func(t *testing.T, dir, outside string) {
			replaceWithLink(t, filepath.Join(dir, "d"), outside)
		}},
		{"file replaced by a relative link out", func(t *testing.T, dir, outside string) {
			replaceWithLink(t, filepath.Join(dir, "d", "secret"), "../../outside/secret")
		}},
		// A file the walk left out (ignored) read in place of a walked one.
		{"file replaced by a link to an ignored file inside", func(t *testing.T, dir, outside string) {
			if err := os.WriteFile(filepath.Join(dir, ".env"), []byte(secret), 0o600); err != nil {
				t.Fatal(err)
			}
			replaceWithLink(t, filepath.Join(dir, "f"), ".env")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			dir, outside := filepath.Join(base, "code"), filepath.Join(base, "outside")
			for _, d := range []string{dir, filepath.Join(dir, "d"), outside} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			pad := strings.Repeat("x", len(secret)) // as long as the secret: a size check alone passes
			for p, data := range map[string]string{
				filepath.Join(dir, "f"):           pad,
				filepath.Join(dir, "d", "secret"): pad,
				filepath.Join(outside, "secret"):  secret,
			} {
				if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			files, _, err := WalkCodebase(dir, UploadOptions{NoIgnoreFiles: true})
			if err != nil {
				t.Fatal(err)
			}
			tt.swap(t, dir, outside)
			var b bytes.Buffer
			err = writeCodebaseTar(&b, dir, files)
			if err == nil {
				t.Errorf("writeCodebaseTar: got success, want an error naming the swapped file")
			}
			if bytes.Contains(b.Bytes(), []byte(secret)) {
				t.Errorf("the tar (%d bytes) holds the secret from outside the directory", b.Len())
			}
		})
	}
}

func replaceWithLink(t *testing.T, p, target string) {
	t.Helper()
	if err := os.RemoveAll(p); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}
