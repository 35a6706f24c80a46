// Package hostimage builds the lower layer of the built-in "host" image that
// every runtime driver offering runtime.CapHostImage stacks under a box: a
// usr-merged skeleton with empty mount points and a minimal /etc. The
// driver bind-mounts the host's /usr over it read-only. It imports nothing
// from sbx; drivers under internal/runtime use it.
package hostimage

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// hostImageVersion names the skeleton layout; bump it when the layout changes
// so existing state dirs get a fresh skeleton.
const hostImageVersion = "host-v4"

// hostEtcAllowlist is everything copied from the host's /etc into the host
// image (globs allowed). Nothing else is: no shadow, ssh, sudoers,
// environment, machine-id, ... — the generated files below stand in for the
// few that matter.
var hostEtcAllowlist = []string{
	"ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "ssl/certs", "ssl/openssl.cnf",
	"ca-certificates.conf", "localtime", "timezone", "mime.types", "protocols", "services",
	"python3*", "bash.bashrc", "profile", "inputrc", "debian_version", "os-release", "fonts", "matplotlibrc",
	// Toolchain configuration the host's /usr links into (/usr/lib/R/etc, the JDK's conf/).
	"R", "java-*-openjdk", "gitconfig",
}

// Generated /etc files of the host image.
var hostEtcGenerated = map[string]string{
	"passwd":        "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
	"group":         "root:x:0:\ntty:x:5:\nnogroup:x:65534:\n",
	"hostname":      "sbx\n",
	"hosts":         "127.0.0.1\tlocalhost sbx\n::1\tlocalhost ip6-localhost ip6-loopback\n",
	"nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n",
	"resolv.conf":   "",
}

// Ensure builds, once, the lower dir of the built-in "host" image at
// imagesDir/host-v1 and returns its path: usr-merged symlinks, empty mount
// points (the host's /usr is bind-mounted read-only over usr at start) and a
// minimal /etc. Everything is owned by the box's mapped root. It is built in
// a temp dir and renamed into place, so a crash never leaves half a skeleton.
func Ensure(imagesDir string, uid, gid int) (string, error) {
	final := filepath.Join(imagesDir, hostImageVersion)
	if _, err := os.Stat(final); err == nil {
		return final, nil
	}
	if err := os.MkdirAll(imagesDir, 0o711); err != nil {
		return "", fmt.Errorf("create images dir: %w", err)
	}
	tmp, err := os.MkdirTemp(imagesDir, ".tmp-"+hostImageVersion+"-")
	if err != nil {
		return "", fmt.Errorf("create host image: %w", err)
	}
	defer os.RemoveAll(tmp) // no-op after a successful rename
	if err := buildHostSkeleton(tmp); err != nil {
		return "", fmt.Errorf("build host image: %w", err)
	}
	if err := filepath.WalkDir(tmp, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	}); err != nil {
		return "", fmt.Errorf("chown host image: %w", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		if _, statErr := os.Stat(final); statErr == nil {
			return final, nil // built concurrently by someone else
		}
		return "", fmt.Errorf("install host image: %w", err)
	}
	return final, nil
}

func buildHostSkeleton(root string) error {
	dirs := []struct {
		path string
		mode fs.FileMode
	}{
		{"usr", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755}, {"etc", 0o755},
		{"tmp", fs.ModeSticky | 0o777}, {"root", 0o700}, {"home", 0o755}, {"run", 0o755}, {"mnt", 0o755},
		{"opt", 0o755}, {"srv", 0o755}, {"media", 0o755}, {"var", 0o755}, {"var/tmp", fs.ModeSticky | 0o777},
		{"var/lib", 0o755}, {"var/log", 0o755}, {"var/cache", 0o755}, {".sbx", 0o755},
	}
	for _, d := range dirs {
		p := filepath.Join(root, d.path)
		if err := os.Mkdir(p, d.mode); err != nil {
			return err
		}
		if err := os.Chmod(p, d.mode); err != nil { // umask
			return err
		}
	}
	for _, name := range []string{"bin", "sbin", "lib", "lib64", "lib32", "libx32"} {
		if _, err := os.Stat(filepath.Join("/usr", name)); err != nil {
			continue
		}
		if err := os.Symlink("usr/"+name, filepath.Join(root, name)); err != nil {
			return err
		}
	}
	etc := filepath.Join(root, "etc")
	for name, content := range hostEtcGenerated {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	for _, pattern := range hostEtcAllowlist {
		matches, _ := filepath.Glob(filepath.Join("/etc", pattern))
		for _, src := range matches {
			rel, _ := filepath.Rel("/etc", src)
			if err := copyTree(src, filepath.Join(etc, rel)); err != nil {
				return fmt.Errorf("copy /etc/%s: %w", rel, err)
			}
		}
	}
	return nil
}

// copyTree copies regular files, directories and symlinks (as symlinks, never
// followed) from src to dst, creating dst's parents.
func copyTree(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		target := filepath.Join(dst, strings.TrimPrefix(p, src))
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.Mkdir(target, info.Mode().Perm())
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		case d.Type().IsRegular():
			if err := CopyFile(p, target, info.Mode().Perm()); err != nil {
				return err
			}
			// Keep the mtime: caches in the host's /usr are checked against
			// it (Python's bytecode for /etc/python3.x/sitecustomize.py; with
			// a new mtime every python3 start compiles it, ~2 ms).
			return os.Chtimes(target, info.ModTime(), info.ModTime())
		}
		return nil // sockets, devices, fifos: skipped
	})
}

// CopyFile copies the regular file src to dst, a new file with mode.
func CopyFile(src, dst string, mode fs.FileMode) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, out.Close()) }()
	_, err = io.Copy(out, in)
	return err
}
