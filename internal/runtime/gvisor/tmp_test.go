//go:build linux

package gvisor_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sbxdev/sbx/internal/idmap"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/testsuite"
	"github.com/sbxdev/sbx/internal/testutil"
)

// TestImageTmp: a box's /tmp is the image's (what the image holds there
// shows, as under oci), except where the image's /tmp is not a directory:
// a symlink to a host directory is never followed on the host (runsc would
// resolve a bind source there), the box gets an empty /tmp of its own,
// nothing it writes reaches the host directory, and the box starts (it did
// not: runsc cannot mount over a symlink).
func TestImageTmp(t *testing.T) {
	testutil.RequiresRoot(t)
	dir, cg := stateRoot(t)
	d := newDriver(t, dir, cg)
	root := int(idmap.Canonical.Base)
	layer := func(name string, fill func(l string)) runtime.Layer {
		l := filepath.Join(dir, name)
		if err := os.Mkdir(l, 0o755); err != nil {
			t.Fatal(err)
		}
		fill(l)
		return runtime.Layer{Dir: l}
	}
	withLayer := func(prefix string, l runtime.Layer) runtime.Spec {
		spec := testsuite.NewSpec(prefix)
		spec.Image.Layers = []runtime.Layer{l}
		return spec
	}

	t.Run("image's tmp shows", func(t *testing.T) {
		l := layer("tmpdir", func(l string) {
			for _, p := range []string{filepath.Join(l, "tmp"), filepath.Join(l, "tmp", "from-image")} {
				var err error
				if filepath.Base(p) == "tmp" {
					err = os.Mkdir(p, os.ModeSticky|0o777)
				} else {
					err = os.WriteFile(p, []byte("image\n"), 0o644)
				}
				if err == nil {
					err = os.Lchown(p, root, root)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
		})
		h := testsuite.Create(t, d, withLayer("tmpimg", l))
		if r := testsuite.MustExec(t, d, h, "cat", "/tmp/from-image"); r.Stdout != "image\n" {
			t.Errorf("/tmp/from-image in the box: %+v, want the image's file", r)
		}
	})

	t.Run("symlinked tmp not followed", func(t *testing.T) {
		host := filepath.Join(dir, "host-dir")
		if err := os.Mkdir(host, 0o777); err != nil {
			t.Fatal(err)
		}
		l := layer("tmplink", func(l string) {
			if err := os.Symlink(host, filepath.Join(l, "tmp")); err != nil {
				t.Fatal(err)
			}
			if err := os.Lchown(filepath.Join(l, "tmp"), root, root); err != nil {
				t.Fatal(err)
			}
		})
		h := testsuite.Create(t, d, withLayer("tmplnk", l))
		if r := testsuite.MustExec(t, d, h, "/bin/sh", "-c", "echo box > /tmp/probe && cat /tmp/probe"); r.Stdout != "box\n" {
			t.Errorf("writing /tmp/probe in the box: %+v", r)
		}
		if ents, _ := os.ReadDir(host); len(ents) != 0 {
			t.Errorf("the host directory the image's /tmp points to holds %d entries, want none", len(ents))
		}
	})
}
