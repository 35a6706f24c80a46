package hostimage

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestCopyTreeKeepsMtime: files copied from the host's /etc keep their
// mtime, which caches in the host's /usr (Python's bytecode of
// /etc/python3.x/sitecustomize.py) are checked against.
func TestCopyTreeKeepsMtime(t *testing.T) {
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "copy")
	if err := os.MkdirAll(filepath.Join(src, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(src, "sub", "sitecustomize.py")
	if err := os.WriteFile(f, []byte("pass\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Date(2025, 4, 28, 14, 11, 48, 0, time.UTC)
	if err := os.Chtimes(f, old, old); err != nil {
		t.Fatal(err)
	}
	if err := copyTree(src, dst); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dst, "sub", "sitecustomize.py"))
	if err != nil {
		t.Fatal(err)
	}
	if !st.ModTime().Equal(old) || st.Mode().Perm() != 0o644 {
		t.Errorf("got mtime %v mode %v, want %v 0644", st.ModTime(), st.Mode().Perm(), old)
	}
}
