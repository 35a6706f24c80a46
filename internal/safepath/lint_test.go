package safepath

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Directive marks a Go file whose code reads or changes trees a sandbox
// could have written. TestHostileTreeFilesUseSafepath refuses path-based
// file system calls in such files: everything goes through a Root. A call on
// a host-chosen path (the data dir's own directories) is allowed on a line
// that says why with a "safepath:ok" comment (on it or just above it).
const Directive = "//sbx:hostile-tree"

// mustCarry lists files that must keep the directive, so that it cannot be
// dropped silently from the code it guards.
var mustCarry = []string{
	"internal/codebase/sync.go",
	"internal/codebase/download_linux.go",
	"internal/runtime/ocibox/diff_linux.go",
	"internal/runtime/gvisor/tmp_linux.go",
	"internal/image/prune.go",
}

// pathCalls are the path-based calls refused in hostile-tree files, by
// package: each resolves a path string from the process's root or cwd and
// follows symlinks in its components.
var pathCalls = map[string][]string{
	"os": {"Open", "OpenFile", "Create", "Lstat", "Stat", "ReadDir", "ReadFile", "WriteFile", "Readlink",
		"Remove", "RemoveAll", "Rename", "Mkdir", "MkdirAll", "MkdirTemp", "CreateTemp", "Symlink", "Link", "Chmod",
		"Chown", "Lchown", "Chtimes", "Truncate", "DirFS", "OpenRoot", "CopyFS"},
	"filepath": {"Walk", "WalkDir", "Glob", "EvalSymlinks"},
	"ioutil":   {"ReadFile", "WriteFile", "ReadDir", "TempDir", "TempFile"},
	"unix": {"Open", "Creat", "Stat", "Lstat", "Getxattr", "Lgetxattr", "Setxattr", "Lsetxattr", "Listxattr",
		"Llistxattr", "Removexattr", "Lremovexattr", "Readlink", "Unlink", "Rmdir", "Mkdir", "Mknod", "Chmod",
		"Chown", "Lchown", "Rename", "Symlink", "Link", "Utimes", "UtimesNano", "Truncate", "Access", "Statfs"},
	"syscall": {"Open", "Creat", "Stat", "Lstat", "Getxattr", "Readlink", "Unlink", "Rmdir", "Mkdir", "Mknod",
		"Chmod", "Chown", "Lchown", "Rename", "Symlink", "Link", "Utimes", "UtimesNano", "Truncate", "Access",
		"Statfs"},
}

func TestHostileTreeFilesUseSafepath(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	carrying := map[string]bool{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") || rel == "api" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if !strings.Contains(string(src), "\n"+Directive+"\n") && !strings.HasPrefix(string(src), Directive+"\n") {
			return nil
		}
		carrying[filepath.ToSlash(rel)] = true
		for _, bad := range lintFile(t, p, src) {
			t.Errorf("%s: path-based %s in a file that handles sandbox-written trees: use a safepath.Root (or say why the path is the host's with a safepath:ok comment)", bad.pos, bad.call)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range mustCarry {
		if !carrying[f] {
			t.Errorf("%s lost its %s directive (or is gone): the code that walks sandbox-written trees must stay checked", f, Directive)
		}
	}
}

type finding struct{ pos, call string }

func lintFile(t *testing.T, path string, src []byte) []finding {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	// Lines excused by a safepath:ok comment, and the line after one.
	ok := map[int]bool{}
	for _, cg := range f.Comments {
		for _, c := range cg.List {
			if strings.Contains(c.Text, "safepath:ok") {
				l := fset.Position(c.Pos()).Line
				ok[l], ok[l+1] = true, true
			}
		}
	}
	// Import names as written in this file ("os", or an alias).
	pkgOf := map[string]string{}
	for _, im := range f.Imports {
		p := strings.Trim(im.Path.Value, `"`)
		name := p[strings.LastIndex(p, "/")+1:]
		if im.Name != nil {
			name = im.Name.Name
		}
		switch p {
		case "os", "path/filepath", "io/ioutil", "golang.org/x/sys/unix", "syscall":
			pkgOf[name] = p[strings.LastIndex(p, "/")+1:]
		}
	}
	var out []finding
	ast.Inspect(f, func(n ast.Node) bool {
		sel, isSel := n.(*ast.SelectorExpr)
		if !isSel {
			return true
		}
		id, isID := sel.X.(*ast.Ident)
		if !isID {
			return true
		}
		pkg, known := pkgOf[id.Name]
		if !known {
			return true
		}
		for _, name := range pathCalls[pkg] {
			if sel.Sel.Name == name {
				pos := fset.Position(sel.Pos())
				if !ok[pos.Line] {
					out = append(out, finding{pos.String(), pkg + "." + name})
				}
			}
		}
		return true
	})
	return out
}

// TestLintFindsPathCalls checks the lint itself against a file that does
// everything wrong and one that does it right.
func TestLintFindsPathCalls(t *testing.T) {
	bad := []byte(Directive + `
package x

import (
	stdos "os"
	"path/filepath"
	"golang.org/x/sys/unix"
)

func f(dir string) {
	stdos.RemoveAll(filepath.Join(dir, "a"))
	filepath.WalkDir(dir, nil)
	unix.Lgetxattr(dir, "x", nil)
	// safepath:ok: the data dir's own tmp dir.
	stdos.Mkdir(dir, 0o700)
	_ = filepath.Join(dir, "b")
}
`)
	got := lintFile(t, "bad.go", bad)
	var calls []string
	for _, f := range got {
		calls = append(calls, f.call)
	}
	if want := "os.RemoveAll filepath.WalkDir unix.Lgetxattr"; strings.Join(calls, " ") != want {
		t.Errorf("lint found %q, want %q", strings.Join(calls, " "), want)
	}
}
