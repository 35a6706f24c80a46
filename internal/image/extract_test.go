//go:build linux

package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/testutil"
)

const testShift = 100000

// ent is one entry of a hand-built tar.
type ent struct {
	hdr  tar.Header
	body string
}

func file(name, body string) ent {
	return ent{tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(body))}, body}
}
func dir(name string, mode int64) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode}}
}
func symlink(name, target string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}
}
func hardlink(name, target string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target}}
}

func tarOf(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := e.hdr
		if h.ModTime.IsZero() {
			h.ModTime = time.Unix(1_600_000_000, 0)
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("write header %q: %v", h.Name, err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// extractT extracts data into <tmp>/layer next to an empty <tmp>/sentinel
// dir, and fails the test if anything appears in the sentinel dir or /etc.
func extractT(t *testing.T, data []byte, opt extractOptions) (string, extractStats, error) {
	t.Helper()
	testutil.RequiresRoot(t)
	base := t.TempDir()
	layer, sentinel := filepath.Join(base, "layer"), filepath.Join(base, "sentinel")
	for _, d := range []string{layer, sentinel} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if opt.UIDShift == 0 {
		opt.UIDShift = testShift
	}
	if opt.MaxBytes == 0 {
		opt.MaxBytes = 1 << 30
	}
	st, err := extractLayer(context.Background(), bytes.NewReader(data), layer, opt)
	t.Cleanup(func() {
		if ents, _ := os.ReadDir(sentinel); len(ents) != 0 {
			t.Errorf("sentinel dir next to the layer got %d entries; want none", len(ents))
		}
		for _, p := range []string{"/etc/sbx-evil", "/sbx-evil", "/etc/sbx-abs"} {
			if _, err := os.Lstat(p); err == nil {
				t.Errorf("%s exists: extraction escaped the layer", p)
				os.Remove(p)
			}
		}
	})
	return layer, st, err
}

func TestExtractRejects(t *testing.T) {
	tests := []struct {
		name string
		tar  []ent
		opt  extractOptions
		want string // in the error
	}{
		{"dotdot", []ent{file("../sentinel/x", "evil")}, extractOptions{}, `"../sentinel/x"`},
		{"dotdot inside", []ent{file("a/../../sentinel/x", "evil")}, extractOptions{}, "escapes the layer root"},
		{"deep dotdot", []ent{file("a/b/../../../../../../etc/sbx-evil", "evil")}, extractOptions{}, "escapes"},
		{"write through absolute symlink", []ent{symlink("etc", "/etc"), file("etc/sbx-evil", "evil")}, extractOptions{}, `"etc/sbx-evil"`},
		{"write through relative symlink", []ent{symlink("s", "../sentinel"), file("s/x", "evil")}, extractOptions{}, `"s/x"`},
		{"mkdir through symlink", []ent{symlink("s", "../sentinel"), dir("s/d/", 0o755)}, extractOptions{}, `"s/d/"`},
		{"symlink chain", []ent{symlink("a", "b"), symlink("b", "/"), file("a/sbx-evil", "evil")}, extractOptions{}, "a/sbx-evil"},
		{"hardlink escape", []ent{hardlink("h", "../sentinel/x")}, extractOptions{}, "escapes"},
		{"hardlink through symlink", []ent{symlink("e", "/etc"), hardlink("h", "e/passwd")}, extractOptions{}, `"h"`},
		{"hardlink to missing", []ent{hardlink("h", "/etc/passwd")}, extractOptions{}, "hardlink target"},
		{"hardlink to dir", []ent{dir("d/", 0o755), hardlink("h", "d")}, extractOptions{}, "is a directory"},
		{"whiteout escape", []ent{file("../.wh.sentinel", "")}, extractOptions{}, "escapes"},
		{"whiteout of dotdot", []ent{file("a/.wh..", "")}, extractOptions{}, "whiteout"},
		{"whiteout through symlink", []ent{symlink("s", "../sentinel"), file("s/.wh.x", "")}, extractOptions{}, `"s/.wh.x"`},
		{"opaque through symlink", []ent{symlink("s", "/etc"), file("s/.wh..wh..opq", "")}, extractOptions{}, `"s/.wh..wh..opq"`},
		{"byte bomb", []ent{file("big", strings.Repeat("x", 2<<20))}, extractOptions{MaxBytes: 1 << 20}, "more than 1048576 bytes"},
		{"entry bomb", []ent{file("1", ""), file("2", ""), file("3", ""), file("4", "")}, extractOptions{MaxEntries: 3}, "more than 3 entries"},
		{"long name", []ent{file(strings.Repeat("a/", 3000)+"x", "")}, extractOptions{}, "longer than"},
		{"file over parent file", []ent{file("f", "x"), file("f/g", "y")}, extractOptions{}, "not a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := extractT(t, tarOf(t, tt.tar...), tt.opt)
			if err == nil {
				t.Fatalf("extract succeeded; want an error containing %q", tt.want)
			}
			t.Logf("error: %v", err)
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q; want it to contain %q", err, tt.want)
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("error %q does not wrap ErrInvalidArgument", err)
			}
		})
	}
}

func TestExtractHarmless(t *testing.T) {
	setuid := file("bin/su", "#!")
	setuid.hdr.Mode = 0o4755 | 0o2000
	tmp := dir("tmp/", 0o1777)
	owned := file("home/u/f", "u")
	owned.hdr.Uid, owned.hdr.Gid = 1000, 1001
	big := file("home/big", "b")
	big.hdr.Uid, big.hdr.Gid = 70000, -1
	dev := ent{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "dev/kmsg", Mode: 0o600, Devmajor: 1, Devminor: 11}}
	fifo := ent{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: "fifo", Mode: 0o600}}
	layer, st, err := extractT(t, tarOf(t,
		dir("./", 0o700),
		file("/etc/sbx-abs", "absolute"), // rooted at the layer, not at /
		symlink("etc/evil-link", "/etc/shadow"),
		symlink("s", "../sentinel/x"), file("s", "replaces the symlink, not its target"),
		file("a", "A"), hardlink("b", "a"), hardlink("a", "a"),
		setuid, tmp, owned, big, dev, fifo,
		dir("opq/", 0o755), file("opq/.wh..wh..opq", ""), file("gone/.wh.old", ""),
		file("c/../d", "cleaned"),
		file(".wh..wh.plnk", ""),
	), extractOptions{})
	if err != nil {
		t.Fatalf("extract: %v", err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(layer, p))
		if err != nil {
			t.Errorf("read %s: %v", p, err)
		}
		return string(b)
	}
	if got := read("etc/sbx-abs"); got != "absolute" {
		t.Errorf("etc/sbx-abs = %q; want %q", got, "absolute")
	}
	if got, _ := os.Readlink(filepath.Join(layer, "etc/evil-link")); got != "/etc/shadow" {
		t.Errorf("symlink target %q; want it verbatim %q", got, "/etc/shadow")
	}
	if fi, err := os.Lstat(filepath.Join(layer, "s")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("s: %v, %v; want a regular file", fi, err)
	}
	if got := read("d"); got != "cleaned" {
		t.Errorf("d = %q; want %q", got, "cleaned")
	}
	var sa, sb unix.Stat_t
	if err := unix.Lstat(filepath.Join(layer, "a"), &sa); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lstat(filepath.Join(layer, "b"), &sb); err != nil {
		t.Fatal(err)
	}
	if sa.Ino != sb.Ino || read("a") != "A" {
		t.Errorf("hardlink b: inode %d, a: %d (content %q); want the same inode with content A", sb.Ino, sa.Ino, read("a"))
	}
	modes := map[string]fs.FileMode{".": fs.ModeDir | 0o700, "bin/su": 0o755, "tmp": fs.ModeDir | fs.ModeSticky | 0o777}
	for p, want := range modes {
		fi, err := os.Lstat(filepath.Join(layer, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("mode of %s = %v; want %v", p, fi.Mode(), want)
		}
	}
	owners := map[string][2]uint32{".": {testShift, testShift}, "home/u/f": {testShift + 1000, testShift + 1001},
		"home/big": {testShift + 65534, testShift + 65534}, "home": {testShift, testShift}, "etc/evil-link": {testShift, testShift}}
	for p, want := range owners {
		var s unix.Stat_t
		if err := unix.Lstat(filepath.Join(layer, p), &s); err != nil {
			t.Fatal(err)
		}
		if s.Uid != want[0] || s.Gid != want[1] {
			t.Errorf("owner of %s = %d:%d; want %d:%d", p, s.Uid, s.Gid, want[0], want[1])
		}
	}
	for _, p := range []string{"dev/kmsg", "fifo", ".wh..wh.plnk"} {
		if _, err := os.Lstat(filepath.Join(layer, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: %v; want it skipped", p, err)
		}
	}
	if st.Skipped != 3 || st.OverflowIDs != 1 || st.Stripped != 1 {
		t.Errorf("stats %+v; want 3 skipped, 1 overflow, 1 stripped", st)
	}
	var wh unix.Stat_t
	if err := unix.Lstat(filepath.Join(layer, "gone/old"), &wh); err != nil {
		t.Fatalf("whiteout: %v", err)
	}
	if wh.Mode&unix.S_IFMT != unix.S_IFCHR || wh.Rdev != 0 {
		t.Errorf("whiteout gone/old: mode %o rdev %d; want a 0:0 char device", wh.Mode, wh.Rdev)
	}
	buf := make([]byte, 8)
	n, err := unix.Lgetxattr(filepath.Join(layer, "opq"), "trusted.overlay.opaque", buf)
	if err != nil || string(buf[:n]) != "y" {
		t.Errorf("opq opaque xattr = %q, %v; want y", buf[:n], err)
	}
	if _, err := os.Lstat(filepath.Join(layer, "opq/.wh..wh..opq")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("opaque marker file exists: %v", err)
	}
	var s unix.Stat_t
	if err := unix.Stat(filepath.Join(layer, "a"), &s); err != nil || s.Mtim.Sec != 1_600_000_000 {
		t.Errorf("mtime of a = %d, %v; want 1600000000", s.Mtim.Sec, err)
	}
}

// TestExtractOverlay mounts an extracted pair of layers with overlayfs and
// checks that whiteouts and opaque dirs mean what they should.
func TestExtractOverlay(t *testing.T) {
	lower, _, err := extractT(t, tarOf(t, file("keep", "k"), file("old", "o"), file("d/x", "x")), extractOptions{})
	if err != nil {
		t.Fatal(err)
	}
	upper, _, err := extractT(t, tarOf(t, file(".wh.old", ""), dir("d/", 0o755), file("d/.wh..wh..opq", ""), file("d/y", "y")), extractOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mnt := t.TempDir()
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+upper+":"+lower); err != nil {
		t.Skipf("overlayfs unavailable: %v", err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	var names []string
	_ = filepath.WalkDir(mnt, func(p string, d fs.DirEntry, err error) error {
		if p != mnt {
			names = append(names, strings.TrimPrefix(p, mnt+"/"))
		}
		return nil
	})
	if got, want := strings.Join(names, " "), "d d/y keep"; got != want {
		t.Errorf("merged tree = %q; want %q", got, want)
	}
}

func TestCleanName(t *testing.T) {
	for in, want := range map[string]string{
		"./": ".", "/": ".", "a/b/": "a/b", "/etc/passwd": "etc/passwd", "a//b/./c": "a/b/c", "a/../b": "b", "a/..": ".",
	} {
		if got, err := cleanName(in); err != nil || got != want {
			t.Errorf("cleanName(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"..", "../a", "a/../..", "/../etc", "a\x00b"} {
		if got, err := cleanName(in); err == nil {
			t.Errorf("cleanName(%q) = %q; want an error", in, got)
		}
	}
}
