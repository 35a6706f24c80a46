package cli

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/boxcopy"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

func newCp(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files between the host and a sandbox (ID:/path on either side)",
		Long: "Copy a file or directory. One side is ID:/path (or NAME:/path).\n" +
			"As with docker cp: a directory copied onto an existing directory DST lands in DST/<its name>;\n" +
			"onto a path that does not exist it becomes DST; SRC ending in /. copies the directory's\n" +
			"contents into DST. A file copied onto an existing directory lands inside it.\n" +
			"A directory is copied recursively; symlinks are copied as links and never followed. Copying out,\n" +
			"symlinks pointing outside the destination (absolute, or climbing out with ..) are skipped\n" +
			"with a warning listing them.",
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: a.completeCp,
		RunE: func(cmd *cobra.Command, args []string) error {
			srcRef, srcPath, srcRemote := splitRemote(args[0])
			dstRef, dstPath, dstRemote := splitRemote(args[1])
			switch {
			case srcRemote && dstRemote:
				return errors.New("cp: copying between two sandboxes is not supported; go through the host")
			case !srcRemote && !dstRemote:
				return errors.New("cp: one of SRC and DST must be ID:/path")
			case dstRemote:
				sb, err := a.client().Lookup(cmd.Context(), dstRef)
				if err != nil {
					return err
				}
				p := a.newTransfer("copying "+srcPath+" to "+args[1], 0)
				defer p.done()
				return copyIn(cmd.Context(), sb, srcPath, dstPath, p)
			default:
				sb, err := a.client().Lookup(cmd.Context(), srcRef)
				if err != nil {
					return err
				}
				p := a.newTransfer("copying "+args[0]+" to "+dstPath, 0)
				defer p.done()
				return copyOut(cmd.Context(), sb, srcPath, dstPath, p)
			}
		},
	}
}

// splitRemote splits "ref:/path". Local paths containing ':' must start with
// '.' or '/' to be read as local.
func splitRemote(arg string) (ref, p string, remote bool) {
	if strings.HasPrefix(arg, "/") || strings.HasPrefix(arg, ".") {
		return "", arg, false
	}
	ref, p, ok := strings.Cut(arg, ":")
	if !ok || ref == "" {
		return "", arg, false
	}
	return ref, p, true
}

// copyIn copies src on the host to dst in sb, counting the bytes read in
// p (nil: none).
func copyIn(ctx context.Context, sb *sbx.Sandbox, src, dst string, p *transfer) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		// Copying onto an existing directory puts the file inside it.
		if info, err := sb.Stat(ctx, dst); err == nil && info.GetType() == sbxv1.FileType_FILE_TYPE_DIR {
			dst = path.Join(dst, filepath.Base(src))
		}
		p.set(0, fi.Size())
		var r io.Reader = f // sent with sendfile(2)
		if p != nil {
			r = &sizedReader{r: p.reader(f), left: fi.Size()}
		}
		_, err = sb.Upload(ctx, dst, r, uint32(fi.Mode().Perm()))
		return err
	}
	if info, err := sb.Stat(ctx, dst); err == nil && info.GetType() == sbxv1.FileType_FILE_TYPE_DIR {
		dst = cpInto(dst, src, path.Join)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(pw, src)) }()
	_, err = sb.UploadTar(ctx, dst, p.reader(pr))
	pr.CloseWithError(err)
	return err
}

// cpInto is where a directory src copied onto the existing directory dst
// goes (docker cp): dst/<src's name>, or dst itself when src ends in "/."
// (its contents) or names a root.
func cpInto(dst, src string, join func(...string) string) string {
	if src == "." || strings.HasSuffix(src, "/.") {
		return dst
	}
	base := path.Base(filepath.ToSlash(src))
	if base == "/" || base == "." || base == ".." {
		return dst
	}
	return join(dst, base)
}

// writeTar writes the tree at dir (without following symlinks) as a tar.
// The tree may be reshaped while it is read (a cloned repository's
// scripts, a directory a sandbox shares): it is read through an os.Root
// (nothing outside dir is ever opened) and each regular file through
// writeTarFile, which reads only the very file the walk saw.
func writeTar(w io.Writer, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer root.Close()
	fsys := root.FS().(fs.ReadLinkFS)
	tw := tar.NewWriter(w)
	err = fs.WalkDir(fsys, ".", func(rel string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		info, err := fsys.Lstat(rel)
		if err != nil {
			return err
		}
		return writeTarEntry(tw, root, rel, info)
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// writeTarEntry writes rel (slash-separated, inside root) as the walk saw
// it (info: its lstat): a symlink as a link, a regular file with exactly
// its walked size from the very same file (opened O_NOFOLLOW through root
// and checked to have info's device and inode), so one swapped for a
// symlink since the walk fails the copy instead of sending what it leads to.
func writeTarEntry(tw *tar.Writer, root *os.Root, rel string, info fs.FileInfo) error {
	link := ""
	if info.Mode()&fs.ModeSymlink != 0 {
		var err error
		if link, err = root.Readlink(rel); err != nil {
			return err
		}
	}
	hdr, err := tar.FileInfoHeader(info, link)
	if err != nil {
		return err
	}
	hdr.Name = rel
	if info.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uname, hdr.Gname, hdr.Uid, hdr.Gid = "", "", 0, 0
	if !info.Mode().IsRegular() {
		return tw.WriteHeader(hdr)
	}
	f, err := openWalked(root, rel, info)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
		return fmt.Errorf("%s: %w (it shrank during the copy?)", rel, err)
	}
	return nil
}

// openWalked opens the regular file rel of root for reading only if it is
// the very file a walk saw (info: its lstat): not followed if it became a
// symlink (O_NOFOLLOW; os.Root keeps any directory swapped for one inside
// root), and of info's device and inode, so neither a file outside nor
// another file of the tree (one a .dockerignore leaves out, say) is read
// in its place.
func openWalked(root *os.Root, rel string, info fs.FileInfo) (*os.File, error) {
	f, err := root.OpenFile(filepath.FromSlash(rel), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: replaced while being read: %w", rel, err)
	}
	now, err := f.Stat()
	if err == nil && (!now.Mode().IsRegular() || !os.SameFile(now, info)) {
		err = fmt.Errorf("%s: replaced by another file while being read; not read", rel)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// copyOut copies src in sb to dst on the host, counting the bytes read in
// p (nil: none).
func copyOut(ctx context.Context, sb *sbx.Sandbox, src, dst string, p *transfer) error {
	info, err := sb.Stat(ctx, src)
	if err != nil {
		return err
	}
	if info.GetType() != sbxv1.FileType_FILE_TYPE_DIR {
		if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
			dst = filepath.Join(dst, path.Base(src))
		}
		tmp, err := os.CreateTemp(filepath.Dir(dst), ".sbx-cp-*")
		if err != nil {
			return err
		}
		defer os.Remove(tmp.Name())
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(sb.Download(ctx, src, pw)) }()
		// Holes arrive as zeros; keep them holes.
		p.set(0, info.GetSize())
		if _, err := boxcopy.WriteFrom(tmp, p.reader(pr), nil); err != nil {
			pr.CloseWithError(err)
			tmp.Close()
			return err
		}
		if err := tmp.Chmod(fs.FileMode(info.GetMode()) & 0o777); err != nil {
			tmp.Close()
			return err
		}
		if err := tmp.Close(); err != nil {
			return err
		}
		return os.Rename(tmp.Name(), dst)
	}
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		dst = cpInto(dst, src, filepath.Join)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(sb.DownloadTar(ctx, src, pw)) }()
	skipped, err := extractTar(p.reader(pr), dst)
	pr.CloseWithError(err)
	if len(skipped) > 0 {
		fmt.Fprintf(os.Stderr, "sbx cp: warning: skipped %d symlink(s) pointing outside %s:\n", len(skipped), dst)
		for _, s := range skipped {
			fmt.Fprintf(os.Stderr, "  %s\n", s)
		}
	}
	return err
}

// linkInside reports whether a symlink at name (a slash path relative to a
// tree's root: a download's destination, a build context's copied tree)
// pointing to target stays, lexically, inside the tree; the daemon's
// extractors apply the same rule.
func linkInside(name, target string) bool {
	if target == "" || path.IsAbs(target) {
		return false
	}
	p := path.Join(path.Dir(name), target)
	return p != ".." && !strings.HasPrefix(p, "../")
}

// climbsAfterName reports whether a symlink target has a ".." after a
// name ("s/x/.."). Lexically such a target may stay inside, but ".." after
// s/x climbs from wherever s/x leads, and the same archive can make s/x a
// link later ("s/x -> .." makes "l -> s/x/.." the destination's parent).
// Leading ".."s climb through the link's own parent directories, which
// are never links (underSymlink), so they resolve as they read.
func climbsAfterName(target string) bool {
	named := false
	for _, p := range strings.Split(target, "/") {
		switch p {
		case "", ".":
		case "..":
			if named {
				return true
			}
		default:
			named = true
		}
	}
	return false
}

// underSymlink reports whether a directory above name in root is a symlink
// (one the destination held before): the lexical check of linkInside
// would not hold for a link made below it.
func underSymlink(root *os.Root, name string) bool {
	for d := path.Dir(name); d != "."; d = path.Dir(d) {
		if fi, err := root.Lstat(d); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return true
		}
	}
	return false
}

// checkLinksResolve resolves, once the whole archive is extracted, every
// symlink it made through root (os.Root follows links only while they stay
// inside dst), and removes and lists as skipped each one that leads out:
// the per-link rules read one target alone, so a link going through a
// link dst already held (the user's "p -> /home/u" makes "l -> p/.ssh"
// lead there) passes them. A dangling link stays.
func checkLinksResolve(root *os.Root, links map[string]string, skipped []string) ([]string, error) {
	names := slices.Sorted(maps.Keys(links))
	for _, name := range names {
		_, err := root.Stat(name)
		if err == nil || errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			continue
		}
		if rerr := root.Remove(name); rerr != nil {
			return skipped, fmt.Errorf("remove %s -> %s, which leads out of the destination: %w", name, links[name], rerr)
		}
		skipped = append(skipped, name+" -> "+links[name])
	}
	return skipped, nil
}

// extractTar unpacks a tar that came from a sandbox — hostile by definition —
// into dst. os.Root confines every operation to dst, so absolute names and
// ".." cannot reach outside it. Symlinks whose target leaves dst (absolute,
// or climbing out with "..", or with a ".." after a name: climbsAfterName)
// are not created: they are returned as
// "name -> target" for a warning. Symlinks that stay inside are kept, but
// no later entry is written through one (an entry below a symlink of this
// archive is an error naming it), and an entry replaces what is at its
// name instead of following it. Device nodes, FIFOs and hard links are
// skipped, setuid/setgid bits dropped.
func extractTar(r io.Reader, dst string) (skipped []string, err error) {
	root, err := os.OpenRoot(dst)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	links := map[string]string{} // symlinks this archive created, to their targets
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return checkLinksResolve(root, links, skipped)
		}
		if err != nil {
			return skipped, fmt.Errorf("reading tar from sandbox: %w", err)
		}
		name := path.Clean("/" + hdr.Name)[1:]
		if name == "" {
			continue
		}
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			if _, ok := links[d]; ok {
				return skipped, fmt.Errorf("tar entry %q: below %q, a symlink of the same archive; refusing to write through it", hdr.Name, d)
			}
		}
		mode := fs.FileMode(hdr.Mode) & 0o777
		switch hdr.Typeflag {
		case tar.TypeDir:
			if _, ok := links[name]; ok {
				return skipped, fmt.Errorf("tar entry %q: a directory over a symlink of the same archive", hdr.Name)
			}
			if err := root.MkdirAll(name, mode|0o700); err != nil {
				return skipped, fmt.Errorf("mkdir %s: %w", name, err)
			}
		case tar.TypeReg:
			if err := root.MkdirAll(path.Dir(name), 0o755); err != nil && path.Dir(name) != "." {
				return skipped, err
			}
			// Replace, never write through, what is there (a symlink).
			if err := root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return skipped, fmt.Errorf("replace %s: %w", name, err)
			}
			delete(links, name)
			f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
			if err != nil {
				return skipped, fmt.Errorf("create %s: %w", name, err)
			}
			// Holes of a sparse file in the box arrive as zeros: keep
			// them holes (a 64 MiB box's 2 GiB sparse file stays small).
			_, err = boxcopy.WriteFrom(f, tr, nil)
			f.Close()
			if err != nil {
				return skipped, fmt.Errorf("write %s: %w", name, err)
			}
		case tar.TypeSymlink:
			if !linkInside(name, hdr.Linkname) || climbsAfterName(hdr.Linkname) || underSymlink(root, name) {
				skipped = append(skipped, name+" -> "+hdr.Linkname)
				continue
			}
			if err := root.MkdirAll(path.Dir(name), 0o755); err != nil && path.Dir(name) != "." {
				return skipped, err
			}
			if err := root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return skipped, fmt.Errorf("replace %s: %w", name, err)
			}
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return skipped, fmt.Errorf("symlink %s: %w", name, err)
			}
			links[name] = hdr.Linkname
		default:
			// Hard links, devices, FIFOs: not copied out.
		}
	}
}
