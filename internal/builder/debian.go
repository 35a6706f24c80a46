package builder

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/image"
)

// DebianRef is the base the builder makes itself when a recipe needs it.
const DebianRef = "debian:bookworm"

const defaultMirror = "http://deb.debian.org/debian"

// debianConfig is the config of the debian base (docker's debian image has
// the same PATH and cmd).
var debianConfig = image.ImageConfig{
	Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
	Cmd: []string{"bash"},
}

func isDebianBookworm(ref string) bool {
	r, err := name.ParseReference(ref)
	if err != nil {
		return false
	}
	want, _ := name.ParseReference(DebianRef)
	return r.Name() == want.Name()
}

// ensureDebian makes debian:bookworm with debootstrap (minbase) from the
// host's Debian mirror, unless it exists. It runs on the host, as root,
// outside any sandbox: debootstrap needs the network and mknod/chroot; the
// result is then imported through the same hostile-tar extractor as any
// layer.
func (b *build) ensureDebian(ctx context.Context, emit Emit) (*image.Image, error) {
	b.debianMu.Lock()
	defer b.debianMu.Unlock()
	if img, err := b.store.Get(ctx, DebianRef); err == nil {
		return img, nil // made by a concurrent build
	}
	start := time.Now()
	tool, err := b.findDebootstrap(ctx, emit)
	if err != nil {
		return nil, err
	}
	mirror := b.cfg.Mirror
	if mirror == "" {
		mirror = hostMirror("/etc/apt")
	}
	work, err := os.MkdirTemp(b.cacheDir, "debootstrap-")
	if err != nil {
		return nil, fmt.Errorf("debootstrap: %w", err)
	}
	defer func() {
		if err := unmountUnder(work); err != nil {
			b.log.Warn("debootstrap: unmounting leftovers", "dir", work, "err", err)
		}
		os.RemoveAll(work)
	}()
	root := filepath.Join(work, "root")
	if err := emit(status(fmt.Sprintf("making %s: debootstrap --variant=minbase bookworm %s (about 30s)", DebianRef, mirror))); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, tool, "--variant=minbase", "bookworm", root, mirror)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	if err := runLogged(cmd, emit); err != nil {
		return nil, fmt.Errorf("debootstrap bookworm from %s: %w", mirror, err)
	}
	if err := cleanRootfs(root); err != nil {
		return nil, fmt.Errorf("debootstrap: clean: %w", err)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(tarDir(ctx, root, pw)) }()
	img, err := b.store.CommitSpec(ctx, "", pr, image.ImageSpec{
		Config: debianConfig, CreatedBy: "debootstrap --variant=minbase bookworm " + mirror, Tag: DebianRef})
	pr.CloseWithError(errors.New("commit ended"))
	if err != nil {
		return nil, fmt.Errorf("import debootstrap result: %w", err)
	}
	b.log.Info("debian base made", "ref", DebianRef, "digest", img.Digest, "size", img.Size, "took", time.Since(start).Round(time.Second))
	return img, nil
}

// findDebootstrap returns debootstrap's path, installing it with apt-get
// when it is missing.
func (b *Builder) findDebootstrap(ctx context.Context, emit Emit) (string, error) {
	if p, err := exec.LookPath("debootstrap"); err == nil {
		return p, nil
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return "", fmt.Errorf("debootstrap is not installed and there is no apt-get to install it: %w", errdefs.ErrFailedPrecondition)
	}
	if err := emit(status("installing debootstrap on the host (apt-get install debootstrap)")); err != nil {
		return "", err
	}
	install := func() error {
		cmd := exec.CommandContext(ctx, "apt-get", "install", "-y", "--no-install-recommends", "debootstrap")
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		return runLogged(cmd, emit)
	}
	if err := install(); err != nil {
		if err := runLogged(exec.CommandContext(ctx, "apt-get", "update"), emit); err != nil {
			return "", fmt.Errorf("apt-get update: %w", err)
		}
		if err := install(); err != nil {
			return "", fmt.Errorf("apt-get install debootstrap: %w", err)
		}
	}
	return exec.LookPath("debootstrap")
}

// runLogged runs cmd with its output sent as log events.
func runLogged(cmd *exec.Cmd, emit Emit) error {
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	done := make(chan struct{})
	var emitErr error
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if emitErr == nil {
				emitErr = emit(&sbxv1.ImageProgress{Event: &sbxv1.ImageProgress_Log{Log: append(sc.Bytes(), '\n')}})
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	err := cmd.Run()
	pw.Close()
	<-done
	if err != nil {
		return err
	}
	return emitErr
}

// hostMirror finds the Debian mirror apt uses on this host (deb822
// .sources files and one-line .list files), falling back to deb.debian.org.
func hostMirror(aptDir string) string {
	files := []string{filepath.Join(aptDir, "sources.list")}
	more, _ := filepath.Glob(filepath.Join(aptDir, "sources.list.d", "*"))
	files = append(files, more...)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var uri string
		switch {
		case strings.HasSuffix(f, ".sources"):
			uri = mirrorFromDeb822(string(b))
		case strings.HasSuffix(f, ".list"):
			uri = mirrorFromList(string(b))
		}
		if uri != "" {
			return uri
		}
	}
	return defaultMirror
}

// mirrorFromDeb822 returns the first URI of a "deb" stanza for suite bookworm.
func mirrorFromDeb822(s string) string {
	for stanza := range strings.SplitSeq(s, "\n\n") {
		f := map[string]string{}
		for line := range strings.SplitSeq(stanza, "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(line, "#") && !strings.HasPrefix(line, " ") {
				f[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
			}
		}
		if f["enabled"] == "no" || !strings.Contains(" "+f["types"]+" ", " deb ") {
			continue
		}
		if !strings.Contains(" "+f["suites"]+" ", " bookworm ") {
			continue
		}
		if uris := strings.Fields(f["uris"]); len(uris) > 0 {
			return uris[0]
		}
	}
	return ""
}

// mirrorFromList returns the URI of the first "deb URI bookworm ..." line.
func mirrorFromList(s string) string {
	for line := range strings.SplitSeq(s, "\n") {
		fields := strings.Fields(line)
		if len(fields) < 3 || fields[0] != "deb" {
			continue
		}
		fields = fields[1:]
		if strings.HasPrefix(fields[0], "[") { // [arch=amd64 signed-by=...]
			for len(fields) > 0 && !strings.HasSuffix(fields[0], "]") {
				fields = fields[1:]
			}
			if len(fields) > 0 {
				fields = fields[1:]
			}
		}
		if len(fields) >= 2 && fields[1] == "bookworm" {
			return fields[0]
		}
	}
	return ""
}

// cleanRootfs drops what a base image should not carry: downloaded
// packages, apt lists, and host-specific files debootstrap copied in.
func cleanRootfs(root string) error {
	debs, _ := filepath.Glob(filepath.Join(root, "var/cache/apt/archives/*.deb"))
	for _, p := range append(debs, filepath.Join(root, "var/cache/apt/pkgcache.bin"), filepath.Join(root, "var/cache/apt/srcpkgcache.bin"),
		filepath.Join(root, "etc/hostname"), filepath.Join(root, "etc/resolv.conf")) {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	lists := filepath.Join(root, "var/lib/apt/lists")
	if err := os.RemoveAll(lists); err != nil {
		return err
	}
	return os.MkdirAll(filepath.Join(lists, "partial"), 0o755)
}

// tarDir writes the tree at root as a layer tar. Symlinks are not
// followed; /dev, /proc and /sys keep only their directory entries; device
// nodes, FIFOs and sockets are left out.
func tarDir(ctx context.Context, root string, w io.Writer) error {
	tw := tar.NewWriter(w)
	links := map[[2]uint64]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		var link string
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return nil // a type tar cannot hold: leave it out
		}
		hdr.Name, hdr.Uname, hdr.Gname = filepath.ToSlash(rel), "", ""
		switch {
		case fi.IsDir():
			hdr.Name += "/"
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if rel == "dev" || rel == "proc" || rel == "sys" {
				return filepath.SkipDir
			}
			return nil
		case fi.Mode()&fs.ModeSymlink != 0:
			return tw.WriteHeader(hdr)
		case !fi.Mode().IsRegular():
			return nil
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
			id := [2]uint64{uint64(st.Dev), st.Ino}
			if first, ok := links[id]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
				return tw.WriteHeader(hdr)
			}
			links[id] = hdr.Name
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.CopyN(tw, f, hdr.Size)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}
