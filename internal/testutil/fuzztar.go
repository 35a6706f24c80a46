package testutil

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Fuzzing the tar extractors: a fuzzer mutating raw tar bytes mostly breaks
// header checksums, so the fuzz input is a small script that TarFromScript
// turns into a well-formed (but hostile) tar. One entry per line:
//
//	d NAME            directory
//	f NAME\tDATA      regular file (DATA may be empty; "\n" cannot occur)
//	s NAME\tTARGET    symlink
//	h NAME\tTARGET    hard link
//	c NAME            character device;  p NAME  FIFO
//	m NAME\tMODE      regular file with octal mode MODE (setuid etc.)
//
// A script starting with "RAW\n" is passed through as raw bytes instead, so
// the tar reader itself still meets garbage. "$OUT" in any field is replaced
// by the outside directory of the Jail (an absolute path a hostile tar would
// aim at).

// TarFromScript builds the tar described by script (see above).
func TarFromScript(script []byte, out string) []byte {
	if rest, ok := bytes.CutPrefix(script, []byte("RAW\n")); ok {
		return rest
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(1700000000, 0)
	for _, line := range strings.Split(string(script), "\n") {
		if len(line) < 2 || line[1] != ' ' {
			continue
		}
		line = strings.ReplaceAll(line, "$OUT", out)
		name, arg, _ := strings.Cut(line[2:], "\t")
		h := &tar.Header{Name: name, Mode: 0o644, ModTime: mtime, Format: tar.FormatPAX}
		var data []byte
		switch line[0] {
		case 'd':
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		case 'f':
			h.Typeflag, data = tar.TypeReg, []byte(arg)
		case 'm':
			h.Typeflag = tar.TypeReg
			var mode int64
			for _, c := range arg {
				if c < '0' || c > '7' {
					break
				}
				mode = mode*8 + int64(c-'0')
			}
			h.Mode = mode & 0o7777
		case 's':
			h.Typeflag, h.Linkname = tar.TypeSymlink, arg
		case 'h':
			h.Typeflag, h.Linkname = tar.TypeLink, arg
		case 'c':
			h.Typeflag, h.Devmajor, h.Devminor = tar.TypeChar, 1, 3
		case 'p':
			h.Typeflag = tar.TypeFifo
		default:
			continue
		}
		h.Size = int64(len(data))
		if tw.WriteHeader(h) != nil {
			continue
		}
		_, _ = tw.Write(data)
	}
	_ = tw.Close()
	return buf.Bytes()
}

// Jail is a directory holding the destination an extractor writes into and
// an outside directory beside it with a canary file, to check afterwards
// that nothing was written, linked or changed outside the destination.
type Jail struct {
	Parent, Dest, Out string
	canary            os.FileInfo
}

// NewJail makes a Jail under a fresh temporary directory.
func NewJail(t testing.TB) *Jail {
	t.Helper()
	j := &Jail{Parent: t.TempDir()}
	j.Dest, j.Out = filepath.Join(j.Parent, "dest"), filepath.Join(j.Parent, "out")
	for _, d := range []string{j.Dest, j.Out} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(j.Out, "canary"), []byte("canary"), 0o644); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(filepath.Join(j.Out, "canary"))
	if err != nil {
		t.Fatal(err)
	}
	j.canary = fi
	return j
}

// Check fails t if anything exists or changed outside Dest, or if a
// regular file in Dest shares its inode with one outside it. It returns
// the total apparent size of Dest's regular files (each inode once).
func (j *Jail) Check(t testing.TB) int64 {
	t.Helper()
	ents, err := os.ReadDir(j.Parent)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 2 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("the extractor wrote beside its destination: %v", names)
	}
	for _, d := range []string{j.Dest, j.Out} {
		if fi, err := os.Lstat(d); err != nil || !fi.IsDir() {
			t.Fatalf("%s is no longer a directory: %v", d, err)
		}
	}
	outs, err := os.ReadDir(j.Out)
	if err != nil || len(outs) != 1 {
		t.Fatalf("the outside directory changed: %d entries, %v", len(outs), err)
	}
	fi, err := os.Lstat(filepath.Join(j.Out, "canary"))
	if err != nil {
		t.Fatalf("canary: %v", err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode() != j.canary.Mode() || fi.Size() != j.canary.Size() || !fi.ModTime().Equal(j.canary.ModTime()) || st.Nlink != 1 {
		t.Fatalf("canary changed: mode %v size %d mtime %v links %d", fi.Mode(), fi.Size(), fi.ModTime(), st.Nlink)
	}
	if b, err := os.ReadFile(filepath.Join(j.Out, "canary")); err != nil || string(b) != "canary" {
		t.Fatalf("canary content changed: %q, %v", b, err)
	}
	var total int64
	seen := map[uint64]bool{}
	_ = filepath.WalkDir(j.Dest, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		if s := info.Sys().(*syscall.Stat_t); !seen[s.Ino] {
			seen[s.Ino] = true
			total += info.Size()
		}
		return nil
	})
	return total
}

// FuzzTarSeeds are scripts every extractor's fuzz target starts from: the
// attacks of ATTACK-CLASSES.md's first two classes.
var FuzzTarSeeds = []string{
	"d a/\nf a/b\thello\nf ./c\tworld\nd a/d/\nm a/x\t4755\n",
	"s esc\t$OUT\nf esc/canary\tpwned\nf esc/new\tpwned\n",
	"s esc\t../out\nf esc/canary\tpwned\nd esc/d/\n",
	"s link\t/\nf link/tmp/pwned\tx\n",
	"f ../out/canary\tpwned\n",
	"f a/../../out/new\tpwned\n",
	"f /abs\tx\nf //x//y\tz\n",
	"h hl\t$OUT/canary\nh hl2\t../out/canary\n",
	"f t\tdata\nh u\tt\nh t\tt\n",
	"s d\t$OUT\nh d/canary\tx\n",
	"f x\tdata\nd x/\nf x/y\tz\n",
	"d x/\nf x/y\tz\nf x\tdata\n",
	"s s\t.\nf s/s/s/f\tz\n",
	"c dev\np fifo\nf .wh.gone\t\nf d/.wh..wh..opq\t\n",
	"RAW\nnot a tar at all",
}
