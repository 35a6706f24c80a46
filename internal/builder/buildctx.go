package builder

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// A Dockerfile build's context is a tar the client made of a directory of
// its own, and it is hostile like everything a client sends: names may be
// absolute, climb out with "..", repeat, lie about types; symlinks may
// point anywhere. It is never written to the host. It is read into memory
// (it is part of one request, so at most MaxContextBytes) and indexed by
// cleaned name; COPY and ADD pick entries from that index and pack them
// into a new tar for the step's sandbox, where the agent's extractor (the
// one every upload goes through) writes them inside the box. Resolving a
// source never follows a symlink: a source whose path goes through a
// symlink entry is refused, and a symlink that is itself copied stays a
// link (which can only point inside the sandbox it lands in).

// MaxContextBytes bounds a Dockerfile build's context tar.
const MaxContextBytes = 48 << 20

// maxContextEntries bounds the entries of a context tar.
const maxContextEntries = 100_000

// maxCopyTarBytes bounds what all COPY and ADD steps of one build hold
// together (each packs its own tar of what it copies) whatever the context;
// copyAllowance bounds it by the context's size too.
const maxCopyTarBytes = 128 << 20

// copyAllowance is what the COPY and ADD steps of a build whose context
// tar has ctxBytes may pack in all: the tars live in the daemon's memory
// for the whole build, so a small context copied again and again must not
// make a small request hold hundreds of MiB (250 copies of a 1 MiB file
// did). Four times the context (the whole context copied a few times over,
// with the tar headers each copy adds) and 1 MiB of slack for many small
// copies, at most maxCopyTarBytes.
func copyAllowance(ctxBytes int) int64 {
	return min(4*int64(ctxBytes)+1<<20, maxCopyTarBytes)
}

// ctxEntry is one file, directory or symlink of the build context.
type ctxEntry struct {
	hdr  tar.Header
	data []byte
}

// buildContext is a context tar indexed by cleaned, relative name.
type buildContext struct {
	entries map[string]*ctxEntry
	names   []string // sorted
	copied  int64    // tar bytes made by copies so far
	allowed int64    // most tar bytes copies may make (copyAllowance)
}

// readContext parses and checks a context tar. An empty context is valid
// (a Dockerfile without COPY needs none).
func readContext(data []byte) (*buildContext, error) {
	bc := &buildContext{entries: map[string]*ctxEntry{}, allowed: copyAllowance(len(data))}
	if len(data) == 0 {
		return bc, nil
	}
	if len(data) > MaxContextBytes {
		return nil, fmt.Errorf("build context of %d bytes: more than %d (list what the build does not need in .dockerignore): %w",
			len(data), MaxContextBytes, errdefs.ErrInvalidArgument)
	}
	bad := func(name, why string) error {
		return fmt.Errorf("build context: entry %s: %s: %w", quoteName(name), why, errdefs.ErrInvalidArgument)
	}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("build context: not a tar: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		if len(bc.entries) >= maxContextEntries {
			return nil, fmt.Errorf("build context: more than %d entries: %w", maxContextEntries, errdefs.ErrInvalidArgument)
		}
		name, err := cleanContextName(hdr.Name)
		if err != nil {
			return nil, bad(hdr.Name, err.Error())
		}
		if name == "." {
			continue
		}
		e := &ctxEntry{hdr: tar.Header{Name: name, Mode: hdr.Mode & 0o7777, ModTime: hdr.ModTime, Format: tar.FormatPAX}}
		switch hdr.Typeflag {
		case tar.TypeDir:
			e.hdr.Typeflag = tar.TypeDir
		case tar.TypeReg:
			e.hdr.Typeflag = tar.TypeReg
			if e.data, err = io.ReadAll(io.LimitReader(tr, hdr.Size)); err != nil || int64(len(e.data)) != hdr.Size {
				return nil, bad(hdr.Name, "truncated")
			}
			e.hdr.Size = hdr.Size
		case tar.TypeSymlink:
			if hdr.Linkname == "" || strings.IndexByte(hdr.Linkname, 0) >= 0 || len(hdr.Linkname) > 4096 {
				return nil, bad(hdr.Name, "bad symlink target")
			}
			e.hdr.Typeflag, e.hdr.Linkname = tar.TypeSymlink, hdr.Linkname
		default:
			return nil, bad(hdr.Name, fmt.Sprintf("type %q: only directories, regular files and symlinks may be in a build context", hdr.Typeflag))
		}
		if _, seen := bc.entries[name]; !seen {
			bc.names = append(bc.names, name)
		}
		bc.entries[name] = e
	}
	slices.Sort(bc.names)
	return bc, nil
}

// cleanContextName checks a name from the context tar (or a COPY source)
// and returns it cleaned and relative ("." for the root).
func cleanContextName(n string) (string, error) {
	switch {
	case n == "":
		return "", errors.New("empty name")
	case len(n) > 4096:
		return "", errors.New("name longer than 4096 bytes")
	case strings.IndexByte(n, 0) >= 0:
		return "", errors.New("NUL in name")
	case !utf8.ValidString(n):
		return "", errors.New("name is not valid UTF-8")
	case strings.HasPrefix(n, "/"):
		return "", errors.New("absolute path")
	}
	for c := range strings.SplitSeq(n, "/") {
		if c == ".." {
			return "", errors.New(`".." component`)
		}
	}
	return path.Clean(n), nil
}

func quoteName(n string) string {
	if len(n) > 200 {
		n = n[:200] + "..."
	}
	return fmt.Sprintf("%q", n)
}

func isGlob(s string) bool { return strings.ContainsAny(s, "*?[") }

// through returns the first proper ancestor of name that is a symlink
// entry ("" if none): a source reached through it would be the link's
// target, which is never followed.
func (bc *buildContext) through(name string) string {
	for i := range len(name) {
		if name[i] == '/' {
			if e := bc.entries[name[:i]]; e != nil && e.hdr.Typeflag == tar.TypeSymlink {
				return name[:i]
			}
		}
	}
	return ""
}

// isDir reports whether name is a directory of the context: an entry that
// is one, or a prefix of other entries (tars need not list directories).
func (bc *buildContext) isDir(name string) bool {
	if name == "." {
		return true
	}
	if e := bc.entries[name]; e != nil {
		return e.hdr.Typeflag == tar.TypeDir
	}
	i, _ := slices.BinarySearch(bc.names, name+"/")
	return i < len(bc.names) && strings.HasPrefix(bc.names[i], name+"/")
}

// copyEntry is an entry to pack, under its name in the destination.
type copyEntry struct {
	e    *ctxEntry // nil: a directory the context tar does not list
	name string
}

// resolve returns what a COPY source names: the entries to copy and their
// names relative to the destination directory, for a destination that is
// a directory (file dest: see copyTar). A directory source copies its
// contents, a file or symlink itself under its base name; a glob matches
// names in the context (not through symlinks).
func (bc *buildContext) resolve(src string) ([]copyEntry, bool, error) {
	clean, err := cleanContextName(src)
	if err != nil {
		return nil, false, fmt.Errorf("source %s: %v; sources are relative paths inside the build context", quoteName(src), err)
	}
	var tops []string
	if isGlob(clean) {
		if _, err := path.Match(clean, ""); err != nil {
			return nil, false, fmt.Errorf("source %s: bad pattern: %v", quoteName(src), err)
		}
		for _, n := range bc.names {
			if ok, _ := path.Match(clean, n); ok && bc.through(n) == "" {
				tops = append(tops, n)
			}
		}
		if len(tops) == 0 {
			return nil, false, fmt.Errorf("source %s: no file in the build context matches", quoteName(src))
		}
	} else {
		if l := bc.through(clean); l != "" {
			return nil, false, fmt.Errorf("source %s goes through the symlink %s; symlinks in the build context are never followed", quoteName(src), quoteName(l))
		}
		if bc.entries[clean] == nil && !bc.isDir(clean) {
			return nil, false, fmt.Errorf("source %s: not in the build context (is it in .dockerignore?)", quoteName(src))
		}
		tops = []string{clean}
	}
	var out []copyEntry
	single := len(tops) == 1 && !bc.isDir(tops[0])
	for _, top := range tops {
		if !bc.isDir(top) {
			out = append(out, copyEntry{e: bc.entries[top], name: path.Base(top)})
			continue
		}
		prefix := top + "/"
		if top == "." {
			prefix = ""
		}
		i, _ := slices.BinarySearch(bc.names, prefix)
		for ; i < len(bc.names) && strings.HasPrefix(bc.names[i], prefix); i++ {
			n := bc.names[i]
			if bc.through(n) != "" {
				continue // behind a symlink: the link itself is copied
			}
			out = append(out, copyEntry{e: bc.entries[n], name: strings.TrimPrefix(n, prefix)})
		}
	}
	return out, single, nil
}

// copyTar packs entries into a tar for a step's upload, files owned by
// root (as COPY without --chown has them).
func (bc *buildContext) copyTar(entries []copyEntry) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, ce := range entries {
		if ce.name == "" || ce.name == "." {
			continue
		}
		// Parents the context tar did not list come first.
		for i := range len(ce.name) {
			if p := ce.name[:i]; ce.name[i] == '/' && !dirs[p] {
				dirs[p] = true
				if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: p + "/", Mode: 0o755, Format: tar.FormatPAX}); err != nil {
					return nil, err
				}
			}
		}
		if ce.e == nil || ce.e.hdr.Typeflag == tar.TypeDir {
			if dirs[ce.name] {
				continue
			}
			dirs[ce.name] = true
		}
		var hdr tar.Header
		var data []byte
		if ce.e == nil {
			hdr = tar.Header{Typeflag: tar.TypeDir, Mode: 0o755}
		} else {
			hdr, data = ce.e.hdr, ce.e.data
		}
		hdr.Name = ce.name
		if hdr.Typeflag == tar.TypeDir {
			hdr.Name += "/"
		}
		if bc.copied+int64(buf.Len())+hdr.Size > bc.allowed {
			return nil, fmt.Errorf("COPY and ADD steps copy more than %d bytes in all (4 times the build context and 1 MiB, at most %d; "+
				"the copies stay in the daemon's memory for the whole build): %w", bc.allowed, maxCopyTarBytes, errdefs.ErrInvalidArgument)
		}
		if err := tw.WriteHeader(&hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	bc.copied += int64(buf.Len())
	return buf.Bytes(), nil
}
