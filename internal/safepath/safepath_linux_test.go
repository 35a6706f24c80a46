package safepath

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tree makes a root with a host canary directory beside it (outside the
// root), which no operation may touch.
func tree(t *testing.T) (root *Root, dir, canary string) {
	t.Helper()
	base := t.TempDir()
	dir, canary = filepath.Join(base, "root"), filepath.Join(base, "host")
	for _, d := range []string{dir, canary, filepath.Join(dir, "d")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must(t, os.WriteFile(filepath.Join(canary, "victim"), []byte("host"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "d", "f"), []byte("box"), 0o644))
	must(t, os.Symlink(canary, filepath.Join(dir, "tohost")))
	must(t, os.Symlink("/", filepath.Join(dir, "toroot")))
	must(t, os.Symlink("d", filepath.Join(dir, "tod")))
	must(t, os.Symlink("/proc/self/fd/0", filepath.Join(dir, "magic")))
	r, err := OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, dir, canary
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func checkCanary(t *testing.T, canary string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(canary, "victim"))
	if err != nil || string(b) != "host" {
		t.Fatalf("host canary changed: %q, %v", b, err)
	}
}

func TestRefusesLinksAndEscapes(t *testing.T) {
	r, _, canary := tree(t)
	for _, tc := range []struct {
		rel  string
		want error
	}{
		{"tohost/victim", ErrSymlink},
		{"toroot/etc/passwd", ErrSymlink},
		{"tod/f", ErrSymlink}, // even inside the root: no symlink is followed
		{"tohost", ErrSymlink},
		{"magic", ErrSymlink},
		{"../host/victim", ErrEscape},
		{"d/../../host/victim", ErrEscape},
		{"/etc/passwd", ErrEscape},
		{"d/f\x00x", ErrEscape},
	} {
		t.Run(tc.rel, func(t *testing.T) {
			if f, err := r.Open(tc.rel); !errors.Is(err, tc.want) {
				if f != nil {
					f.Close()
				}
				t.Errorf("Open(%q) = %v, want %v", tc.rel, err, tc.want)
			}
			if _, err := r.ReadDir(tc.rel); !errors.Is(err, tc.want) {
				t.Errorf("ReadDir(%q) = %v, want %v", tc.rel, err, tc.want)
			}
			if f, err := r.OpenFile(tc.rel, os.O_WRONLY|os.O_TRUNC, 0); !errors.Is(err, tc.want) {
				if f != nil {
					f.Close()
				}
				t.Errorf("OpenFile(%q, write) = %v, want %v", tc.rel, err, tc.want)
			}
		})
	}
	// Operations on a final component act on the link, through an
	// intermediate one not at all.
	for _, rel := range []string{"tohost/victim", "toroot/tmp"} {
		if err := r.RemoveAll(rel); !errors.Is(err, ErrSymlink) {
			t.Errorf("RemoveAll(%q) = %v, want ErrSymlink", rel, err)
		}
		if err := r.Remove(rel); !errors.Is(err, ErrSymlink) {
			t.Errorf("Remove(%q) = %v, want ErrSymlink", rel, err)
		}
		if _, err := r.Lstat(rel); !errors.Is(err, ErrSymlink) {
			t.Errorf("Lstat(%q) = %v, want ErrSymlink", rel, err)
		}
		if err := r.Lchown(rel, 1, 1); !errors.Is(err, ErrSymlink) {
			t.Errorf("Lchown(%q) = %v, want ErrSymlink", rel, err)
		}
		if err := r.Chtimes(rel, time.Unix(0, 0), time.Unix(0, 0)); !errors.Is(err, ErrSymlink) {
			t.Errorf("Chtimes(%q) = %v, want ErrSymlink", rel, err)
		}
		if err := r.Symlink("x", rel+"/new"); !errors.Is(err, ErrSymlink) {
			t.Errorf("Symlink under %q = %v, want ErrSymlink", rel, err)
		}
	}
	if err := r.Chmod("tohost", 0o777); !errors.Is(err, ErrSymlink) {
		t.Errorf("Chmod(tohost) = %v, want ErrSymlink", err)
	}
	fi, err := r.Lstat("tohost")
	if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("Lstat(tohost) = %v, %v; want the symlink itself", fi, err)
	}
	if target, err := r.Readlink("tohost"); err != nil || target != canary {
		t.Errorf("Readlink(tohost) = %q, %v", target, err)
	}
	must(t, r.Lchown("tohost", 4242, 4242))
	must(t, r.RemoveAll("tohost"))
	must(t, r.RemoveAll("toroot"))
	checkCanary(t, canary)
	var st unix.Stat_t
	must(t, unix.Stat(canary, &st))
	if st.Uid == 4242 {
		t.Error("Lchown of a symlink changed its target")
	}
}

func TestRemoveAllNeverFollows(t *testing.T) {
	r, dir, canary := tree(t)
	must(t, os.MkdirAll(filepath.Join(dir, "x", "y"), 0o755))
	must(t, os.Symlink(canary, filepath.Join(dir, "x", "y", "link")))
	must(t, os.Symlink(filepath.Join(canary, "victim"), filepath.Join(dir, "x", "filelink")))
	must(t, r.RemoveAll("x"))
	must(t, r.RemoveAll("nonexistent/deeper"))
	if _, err := os.Lstat(filepath.Join(dir, "x")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("x still there: %v", err)
	}
	checkCanary(t, canary)
	if err := r.RemoveAll("."); err == nil {
		t.Error("RemoveAll of the root itself succeeded")
	}
}

func TestWalk(t *testing.T) {
	r, dir, canary := tree(t)
	must(t, os.MkdirAll(filepath.Join(dir, "d", "e"), 0o755))
	var got []string
	must(t, r.Walk(".", func(rel string, e Entry) error {
		got = append(got, rel)
		return nil
	}))
	want := "d d/e d/f magic tod tohost toroot"
	if strings.Join(got, " ") != want {
		t.Errorf("walk = %q, want %q (symlinks listed, not entered)", strings.Join(got, " "), want)
	}
	// A directory swapped for a symlink while the walk runs ends it.
	err := r.Walk(".", func(rel string, e Entry) error {
		if rel == "d" {
			must(t, os.Rename(filepath.Join(dir, "d"), filepath.Join(dir, "d.old")))
			must(t, os.Symlink(canary, filepath.Join(dir, "d")))
		}
		if strings.HasPrefix(rel, "d/") {
			t.Errorf("walk entered the swapped directory: %s", rel)
		}
		return nil
	})
	if !errors.Is(err, ErrSymlink) {
		t.Errorf("walk over a swapped dir = %v, want ErrSymlink", err)
	}
}

func TestDeeperThanPathMax(t *testing.T) {
	r, _, _ := tree(t)
	rel := "d"
	for len(rel) < 3*unix.PathMax {
		rel += "/" + strings.Repeat("n", 200)
		must(t, r.Mkdir(rel, 0o755))
	}
	f, err := r.OpenFile(rel+"/file", os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	must(t, err)
	f.Close()
	fi, err := r.Lstat(rel + "/file")
	if err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("Lstat deep file = %v, %v", fi, err)
	}
	n := 0
	must(t, r.Walk("d", func(string, Entry) error { n++; return nil }))
	if n < 3*unix.PathMax/201 {
		t.Errorf("walk saw %d entries", n)
	}
	must(t, r.RemoveAll("d"))
}

func TestChangesInsideRoot(t *testing.T) {
	r, dir, _ := tree(t)
	must(t, r.Mkdir("n", 0o700))
	must(t, r.Symlink("../../anything", "n/l"))
	must(t, r.Link(r, "d/f", "n/hard"))
	must(t, r.Rename("n/hard", "n/moved"))
	must(t, r.Chmod("n/moved", 0o640|fs.ModeSetgid))
	mt := time.Unix(1700000000, 0)
	must(t, r.Chtimes("n/moved", mt, mt))
	fi, err := os.Lstat(filepath.Join(dir, "n", "moved"))
	must(t, err)
	if fi.Mode().Perm() != 0o640 || fi.Mode()&fs.ModeSetgid == 0 || !fi.ModTime().Equal(mt) {
		t.Errorf("moved: mode %v mtime %v", fi.Mode(), fi.ModTime())
	}
	es, err := r.ReadDir("n")
	must(t, err)
	if len(es) != 2 || es[0].Name() != "l" || es[0].Type()&fs.ModeSymlink == 0 || es[1].Name() != "moved" {
		t.Errorf("ReadDir(n) = %v", es)
	}
	if Stat(es[1].info) == nil || Stat(es[1].info).Nlink != 2 {
		t.Errorf("hard link count: %+v", Stat(es[1].info))
	}
	sub, err := r.OpenRoot("n")
	must(t, err)
	defer sub.Close()
	if _, err := sub.Open("l"); !errors.Is(err, ErrSymlink) {
		t.Errorf("sub-root Open(l) = %v", err)
	}
	if _, err := r.OpenRoot("tod"); !errors.Is(err, ErrSymlink) {
		t.Errorf("OpenRoot(tod) = %v", err)
	}
	must(t, r.Remove("n/l"))
	must(t, r.Remove("n/moved"))
	must(t, r.Remove("n"))
}

func TestClean(t *testing.T) {
	for in, want := range map[string]string{"": ".", ".": ".", "a//b/": "a/b", "./a": "a", "a/./b": "a/b"} {
		if got, err := Clean(in); err != nil || got != want {
			t.Errorf("Clean(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"/a", "..", "a/../b", "a/..", "a\x00"} {
		if _, err := Clean(in); !errors.Is(err, ErrEscape) {
			t.Errorf("Clean(%q) = %v, want ErrEscape", in, err)
		}
	}
}
