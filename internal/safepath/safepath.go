// Package safepath is the one way host-side code (the daemon, and the agent
// inside a sandbox) opens, lists, changes and removes files in a directory
// tree that a sandbox could have written: an overlay upper dir, a codebase
// revision tree, a volume, a snapshot diff, a build context. Such a tree is
// hostile: any component of any path in it may be a symlink (to "/", to a
// host directory, to /proc/1/fd/N) planted by the sandbox or swapped in
// between two calls.
//
// A Root is an open directory handle. Every operation resolves its path
// relative to that handle with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|
// RESOLVE_NO_MAGICLINKS): no component may be a symlink or a magic link, and
// nothing resolves outside the root, whatever the tree holds at the moment of
// the call. Operations on a final component (remove, chown, chtimes, rename,
// readlink, link, symlink) act on the name itself through its parent's handle
// and never follow it. Paths are slash-separated and relative ("a/b"); "" and
// "." are the root itself; absolute paths and ".." components are refused.
//
// Code that walks such a tree with filepath.Join and os.* instead is a bug;
// internal/safepath/lint_test.go keeps it from coming back in the packages
// that handle sandbox-written trees.
//
// This package imports only the standard library and golang.org/x/sys, so
// the agent may use it too.
package safepath

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"
)

// ErrSymlink reports a path with a symlink (or magic link) in a component
// where none may be followed.
var ErrSymlink = errors.New("path has a symlink in it")

// ErrEscape reports a path that is absolute, has a ".." component or
// otherwise leaves its root.
var ErrEscape = errors.New("path leaves its root")

// Clean checks a relative path taken from a request or a tree and returns it
// in canonical form ("." for the root). It refuses absolute paths, ".."
// components and NUL bytes; it does not touch the file system.
func Clean(rel string) (string, error) {
	if strings.IndexByte(rel, 0) >= 0 {
		return "", &fs.PathError{Op: "resolve", Path: rel, Err: fmt.Errorf("%w: NUL byte in name", ErrEscape)}
	}
	if rel == "" || rel == "." {
		return ".", nil
	}
	if strings.HasPrefix(rel, "/") {
		return "", &fs.PathError{Op: "resolve", Path: rel, Err: fmt.Errorf("%w: absolute path", ErrEscape)}
	}
	for _, c := range strings.Split(rel, "/") {
		if c == ".." {
			return "", &fs.PathError{Op: "resolve", Path: rel, Err: fmt.Errorf("%w: \"..\" component", ErrEscape)}
		}
	}
	return path.Clean(rel), nil
}

// split returns the parent and final name of a cleaned path other than ".".
func split(rel string) (dir, name string) {
	dir, name = path.Split(rel)
	if dir == "" {
		return ".", name
	}
	return strings.TrimSuffix(dir, "/"), name
}

// WalkFunc is called by Root.Walk for every entry below the walked path,
// parents before children, with the entry's slash-separated path relative to
// the root. Returning fs.SkipDir from a directory skips its contents; any
// other error ends the walk.
type WalkFunc func(rel string, e Entry) error
