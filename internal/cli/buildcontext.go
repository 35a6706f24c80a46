package cli

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// A recipe is a hostile document (an agent may have written it), so its
// copy steps may read only the build context: a directory the user chose
// (`sbx build --context DIR`, by default the recipe file's directory). A
// copy's src is a relative, slash-separated path that stays inside it: no
// absolute path, no ".." component. The context is read through an
// os.Root, which never resolves a name outside the directory, whatever
// symlinks it holds or gains meanwhile. Symlinks are never followed: one
// pointing inside what is copied is archived as a link; one pointing out of
// it (absolute, or climbing out with "..", such as a link to /etc, or
// leading out through other links of the tree) is refused with its name, as the daemon's extractor would refuse it later;
// a src that goes through a symlink leading out of the context is refused
// too. Only directories, regular files and symlinks are copied. os.Root
// rather than internal/safepath, because the CLI also runs off Linux.

// buildContext reads copy sources from the build context directory.
type buildContext struct {
	dir  string
	root *os.Root // opened at the first copy step
	sent int64    // tar bytes of all copy steps so far
}

func (bc *buildContext) Close() error {
	if bc.root == nil {
		return nil
	}
	return bc.root.Close()
}

// checkCopySrc checks a copy step's src and returns it cleaned ("." for
// the whole context).
func checkCopySrc(src string) (string, error) {
	bad := func(why string) error {
		return fmt.Errorf("src %q: %s; copy sources are relative paths inside the build context (see --context)", src, why)
	}
	switch {
	case src == "":
		return "", bad("empty")
	case strings.IndexByte(src, 0) >= 0:
		return "", bad("has a NUL byte")
	case strings.HasPrefix(src, "/") || filepath.IsAbs(src):
		return "", bad("is an absolute path")
	}
	for _, c := range strings.Split(filepath.ToSlash(src), "/") {
		if c == ".." {
			return "", bad(`has a ".." component`)
		}
	}
	return path.Clean(filepath.ToSlash(src)), nil
}

// tar packs src (checked by checkCopySrc): a file as one entry named after
// it, a directory as its contents, in a stable order, symlinks as links.
func (bc *buildContext) tar(src string) ([]byte, error) {
	if bc.root == nil {
		r, err := os.OpenRoot(bc.dir)
		if err != nil {
			return nil, fmt.Errorf("open the build context: %w", err)
		}
		bc.root = r
	}
	fsys := bc.root.FS().(fs.ReadLinkFS)
	fi, err := fsys.Lstat(src)
	if err != nil {
		return nil, contextErr(src, bc.dir, err)
	}
	// tree resolves links within what is copied: a link passes only if it
	// reads as inside alone (linkInside) and also resolves inside through
	// the other links there ("l -> s/x/.." with "s/x -> .." does not).
	var tree *os.Root
	if fi.IsDir() {
		if tree, err = bc.root.OpenRoot(filepath.FromSlash(src)); err != nil {
			return nil, contextErr(src, bc.dir, err)
		}
		defer tree.Close()
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(p, name string, fi fs.FileInfo) error {
		var link string
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if link, err = fsys.ReadLink(p); err != nil {
				return err
			}
			if !linkInside(name, link) || tree != nil && resolvesOut(tree, name) {
				return fmt.Errorf("symlink %s -> %q points out of what is copied; symlinks are copied as links only when they point inside it, never followed", p, link)
			}
		case fi.IsDir(), fi.Mode().IsRegular():
		default:
			return nil // sockets, devices, FIFOs: left out
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = name, 0, 0, "", ""
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{} // only content and mtime count
		if fi.IsDir() {
			hdr.Name += "/"
		}
		if bc.sent+int64(buf.Len())+hdr.Size > maxCopyBytes {
			return fmt.Errorf("copy steps send more than %d bytes", maxCopyBytes)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := openWalked(bc.root, p, fi)
		if err != nil {
			return err
		}
		defer f.Close()
		// Exactly the size the header says, whatever the file does meanwhile.
		if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		return nil
	}
	if !fi.IsDir() {
		err = add(src, path.Base(src), fi)
	} else {
		// WalkDir lists each directory sorted and does not descend into
		// symlinks; os.Root keeps every name inside the context.
		err = fs.WalkDir(fsys, src, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if p == src {
				return nil
			}
			fi, err := fsys.Lstat(p)
			if err != nil {
				return err
			}
			name := p
			if src != "." {
				name = strings.TrimPrefix(p, src+"/")
			}
			return add(p, name, fi)
		})
	}
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		return nil, contextErr(src, bc.dir, err)
	}
	bc.sent += int64(buf.Len())
	return buf.Bytes(), nil
}

// resolvesOut reports whether the symlink name of tree, resolved through
// tree's other links, leads out of it (os.Root refuses to leave it); a
// dangling link does not.
func resolvesOut(tree *os.Root, name string) bool {
	_, err := tree.Stat(filepath.FromSlash(name))
	return err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR)
}

// contextErr explains a failure to read src from the build context.
func contextErr(src, dir string, err error) error {
	var pe *fs.PathError
	// os.Root's refusal to leave its directory has no exported sentinel.
	if errors.As(err, &pe) && strings.Contains(pe.Err.Error(), "escapes from parent") {
		return fmt.Errorf("src %q: %s leads out of the build context %s through a symlink, which is not followed: %w", src, pe.Path, dir, err)
	}
	return fmt.Errorf("src %q in build context %s: %w", src, dir, err)
}
