//go:build linux

package sbx

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHostileIgnoreFiles plants ignore files a hostile tree can hold: the
// walkers open them for their own reasons, so one that leads out of the
// tree, blocks (a FIFO) or never ends (/dev/zero) must be refused before it
// is opened, naming the file. Each walk has a deadline: opening such a file
// hangs, which must show as a failure, not as a hung test binary.
func TestHostileIgnoreFiles(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "shadow")
	if err := os.WriteFile(outside, []byte("*\n"), 0o600); err != nil { // read, it would ignore everything
		t.Fatal(err)
	}
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	symlink := func(target string) func(string) error {
		return func(p string) error { return os.Symlink(target, p) }
	}
	mkfifo := func(p string) error { return syscall.Mkfifo(p, 0o600) }
	big := func(p string) error { return os.WriteFile(p, []byte(strings.Repeat("#", MaxIgnoreFileBytes+1)), 0o644) }
	tests := []struct {
		name  string
		rel   string
		plant func(string) error
		want  string
	}{
		{"gitignore to a file outside", ".gitignore", symlink(outside), ".gitignore: is a symlink"},
		{"gitignore to /dev/zero", ".gitignore", symlink("/dev/zero"), ".gitignore: is a symlink"},
		{"gitignore to a FIFO inside", ".gitignore", symlink("sub/fifo"), ".gitignore: is a symlink"},
		{"gitignore to a FIFO outside", ".gitignore", symlink(fifo), ".gitignore: is a symlink"},
		{"sandboxignore is a FIFO", ".sandboxignore", mkfifo, ".sandboxignore: is a FIFO"},
		{"nested gitignore to /dev/zero", "sub/.gitignore", symlink("/dev/zero"), "sub/.gitignore: is a symlink"},
		{"gitignore over 1 MiB", ".gitignore", big, "more than the 1048576"},
		{"dockerignore to /dev/zero", ".dockerignore", symlink("/dev/zero"), ".dockerignore: is a symlink"},
		{"dockerignore to a file outside", ".dockerignore", symlink(outside), ".dockerignore: is a symlink"},
		{"dockerignore is a FIFO", ".dockerignore", mkfifo, ".dockerignore: is a FIFO"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mkfifo(filepath.Join(dir, "sub", "fifo"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "app.py"), []byte("print(1)\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := tt.plant(filepath.Join(dir, tt.rel)); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			var files []LocalFile
			go func() {
				var err error
				if tt.rel == ".dockerignore" {
					_, err = PackContext(dir)
				} else {
					files, _, err = WalkCodebase(dir, UploadOptions{})
				}
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("walk: got error %v (files %d), want one naming %q", err, len(files), tt.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("walk hung: it opened an ignore file that blocks or never ends")
			}
		})
	}
}

// TestIgnoreFilesOff: with ignore files off, a tree with a hostile one walks,
// its link uploaded as a link.
func TestIgnoreFilesOff(t *testing.T) {
	dir := t.TempDir()
	if err := os.Symlink("/dev/zero", filepath.Join(dir, ".gitignore")); err != nil {
		t.Fatal(err)
	}
	files, _, err := WalkCodebase(dir, UploadOptions{NoIgnoreFiles: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 1 || files[0].Rel != ".gitignore" || files[0].Info.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("got %v, want the one symlink .gitignore", files)
	}
}
