package permfs

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/permrules"
	"github.com/sbxdev/sbx/internal/testutil"
)

// mountTree makes a tree in a temp dir, guards it with the agent-safe preset
// and returns the guarded path.
func mountTree(t *testing.T) string {
	t.Helper()
	testutil.RequiresRoot(t)
	return mountTreeB(t)
}

func mountTreeB(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	dir := t.TempDir()
	files := map[string]string{
		".env": "SECRET=1", "secrets/x": "s", "a.key": "k", "src/main.go": "package main",
		"output/keep": "o", "README": "hello", "src/sub/deep.txt": "d", "output/d/priv": "p", "output/d/pub": "q",
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Pre-existing hardlinks: a hidden and a read-only name of one file.
	if err := os.Link(filepath.Join(dir, "secrets/x"), filepath.Join(dir, "src/x-link")); err != nil {
		t.Fatal(err)
	}
	pol, err := permrules.Compile(&sbxv1.PathPolicy{Path: dir, Preset: "agent-safe", Rules: []*sbxv1.PermissionRule{
		{Pattern: "/README", Type: sbxv1.PatternType_PATTERN_TYPE_FILE, Permission: sbxv1.Permission_PERMISSION_VIEW, Priority: 50},
		{Pattern: "/output/d/priv", Type: sbxv1.PatternType_PATTERN_TYPE_FILE, Permission: sbxv1.Permission_PERMISSION_NONE, Priority: 200},
	}})
	if err != nil {
		t.Fatal(err)
	}
	g, err := Mount(pol, slog.Default())
	if err != nil {
		t.Fatalf("Mount: %v", err)
	}
	t.Cleanup(func() {
		if err := g.Unmount(); err != nil {
			t.Errorf("Unmount: %v", err)
		}
	})
	return dir
}

func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return 0
}

// Refused changes to READ and VIEW files that the kernel checks before
// asking the layer (unlink, rename, link, chmod, chown) fail with EOVERFLOW:
// such files are shown with an unmappable group (see fillAttr), and the
// kernel refuses to change inodes with unmapped ids that way.
func TestPermFS(t *testing.T) {
	dir := mountTree(t)
	p := func(s string) string { return filepath.Join(dir, s) }
	check := func(name string, err error, want syscall.Errno) {
		t.Helper()
		if got := errnoOf(err); got != want || (want == 0 && err != nil) {
			t.Errorf("%s: got %v, want errno %d (%v)", name, err, want, want)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{"README", "output", "src"}; !slices.Equal(names, want) {
		t.Errorf("root lists %v, want %v", names, want)
	}
	_, err = os.Stat(p(".env"))
	check("stat .env", err, syscall.ENOENT)
	_, err = os.ReadFile(p("secrets/x"))
	check("read secrets/x", err, syscall.ENOENT)
	_, err = os.Stat(p("README"))
	check("stat README (view)", err, 0)
	_, err = os.ReadFile(p("README"))
	check("read README (view)", err, syscall.EACCES)
	b, err := os.ReadFile(p("src/main.go"))
	check("read src/main.go", err, 0)
	if string(b) != "package main" {
		t.Errorf("src/main.go = %q", b)
	}
	check("write src/main.go", os.WriteFile(p("src/main.go"), []byte("x"), 0o644), syscall.EACCES)
	check("create in src", os.WriteFile(p("src/new"), []byte("x"), 0o644), syscall.EACCES)
	check("write output/new", os.WriteFile(p("output/new"), []byte("x"), 0o644), 0)
	check("create output/x.key", os.WriteFile(p("output/x.key"), []byte("x"), 0o644), syscall.EACCES)
	check("mkdir output/d2", os.Mkdir(p("output/d2"), 0o755), 0)
	check("chmod src/main.go", os.Chmod(p("src/main.go"), 0o600), syscall.EOVERFLOW)
	check("truncate src/main.go", os.Truncate(p("src/main.go"), 0), syscall.EACCES)
	check("remove src/main.go", os.Remove(p("src/main.go")), syscall.EOVERFLOW)
	check("rmdir src/sub", unix.Rmdir(p("src/sub")), syscall.EACCES)
	// Trickery.
	check("rename read-only into output", os.Rename(p("src/main.go"), p("output/main.go")), syscall.EOVERFLOW)
	check("rename over hidden name", os.Rename(p("output/new"), p("output/.env")), syscall.EACCES)
	check("hardlink read-only into output", os.Link(p("src/main.go"), p("output/l")), syscall.EOVERFLOW)
	check("hardlink view into output", os.Link(p("README"), p("output/l")), syscall.EOVERFLOW)
	check("symlink to hidden", os.Symlink("../.env", p("output/s")), 0)
	_, err = os.ReadFile(p("output/s"))
	check("read via symlink to hidden", err, syscall.ENOENT)
	check("symlink to read-only", os.Symlink("../src/main.go", p("output/s2")), 0)
	check("write via symlink to read-only", os.WriteFile(p("output/s2"), []byte("x"), 0o644), syscall.EACCES)
	_, err = os.ReadFile(p("output/../secrets/x"))
	check("dotdot to hidden", err, syscall.ENOENT)
	check("write output/new", os.WriteFile(p("output/new"), []byte("x"), 0o644), 0)
	check("rename within output", os.Rename(p("output/new"), p("output/new2")), 0)
	check("rename output dir to src", os.Rename(p("output/d"), p("src/d")), syscall.EACCES)
	// A directory moves only if nothing below it gets more visible.
	_, err = os.Stat(p("output/d/priv"))
	check("stat output/d/priv", err, syscall.ENOENT)
	check("rename dir exposing a hidden file", os.Rename(p("output/d"), p("output/e")), syscall.EXDEV)
	check("rmdir dir with a hidden file", os.Remove(p("output/d/pub")), 0)
	check("rmdir dir with a hidden file", unix.Rmdir(p("output/d")), syscall.ENOTEMPTY)
	check("rename plain dir", os.Rename(p("output/d2"), p("output/d3")), 0)
	// Hardlinks in the backing tree stay separate nodes.
	_, err = os.Stat(p("src/x-link"))
	check("stat read-only name of a hidden file", err, 0)
	_, err = os.Stat(p("secrets/x"))
	check("stat hidden name of a visible file", err, syscall.ENOENT)
	f, err := os.Open(p("src/main.go"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = unix.Mmap(int(f.Fd()), 0, 12, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	check("mmap read-only file writable", err, syscall.EACCES)
	f.Close()
	_, err = os.OpenFile(p("src/main.go"), os.O_RDWR, 0)
	check("open read-only O_RDWR", err, syscall.EACCES)
	// Names of one file see each other's writes (each has its own cache).
	check("write output/l1", os.WriteFile(p("output/l1"), []byte("one"), 0o644), 0)
	check("link output/l2", os.Link(p("output/l1"), p("output/l2")), 0)
	if b, _ := os.ReadFile(p("output/l2")); string(b) != "one" {
		t.Errorf("output/l2 = %q, want one", b)
	}
	check("rewrite output/l1", os.WriteFile(p("output/l1"), []byte("six"), 0o644), 0)
	waitContent(t, p("output/l2"), "six")
	// A file unlinked while open keeps working for whoever holds it.
	o, err := os.OpenFile(p("output/open"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.WriteString("abc"); err != nil {
		t.Fatal(err)
	}
	check("unlink open file", os.Remove(p("output/open")), 0)
	if _, err := o.WriteAt([]byte("d"), 3); err != nil {
		t.Errorf("write after unlink: %v", err)
	}
	buf := make([]byte, 8)
	if k, err := o.ReadAt(buf, 0); string(buf[:k]) != "abcd" {
		t.Errorf("read after unlink: got %q, %v; want abcd", buf[:k], err)
	}
	if fi, err := o.Stat(); err != nil || fi.Size() != 4 {
		t.Errorf("fstat after unlink: %v, %v; want size 4", fi, err)
	}
	o.Close()
	// Nothing changed underneath.
	if b, _ := os.ReadFile(p("src/main.go")); string(b) != "package main" {
		t.Errorf("src/main.go changed to %q", b)
	}
}

// waitContent waits (briefly: cache drops are asynchronous) for path to hold want.
func waitContent(t *testing.T, path, want string) {
	t.Helper()
	var b []byte
	for range 100 {
		if b, _ = os.ReadFile(path); string(b) == want {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("%s = %q, want %q", path, b, want)
}
