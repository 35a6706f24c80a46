package permfs

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkOpenRead compares open+read(1 KiB)+close through the layer with
// the same on the backing directory (unmounted twin with the same content).
func BenchmarkOpenRead(b *testing.B) {
	plainDir := b.TempDir()
	if err := os.WriteFile(filepath.Join(plainDir, "f"), make([]byte, 1024), 0o644); err != nil {
		b.Fatal(err)
	}
	dir := mountTreeB(b)
	if err := os.WriteFile(filepath.Join(dir, "output", "f"), make([]byte, 1024), 0o644); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 1024)
	for _, bc := range []struct{ name, path string }{{"plain", filepath.Join(plainDir, "f")}, {"guarded", filepath.Join(dir, "output", "f")}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				fd, err := unix.Open(bc.path, unix.O_RDONLY, 0)
				if err != nil {
					b.Fatal(err)
				}
				unix.Read(fd, buf)
				unix.Close(fd)
			}
		})
	}
}
