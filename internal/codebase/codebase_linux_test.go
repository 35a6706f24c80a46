package codebase

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/hostmount"
	"github.com/sbxdev/sbx/internal/overlay"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/store"
	"github.com/sbxdev/sbx/internal/testutil"
)

type ent struct {
	name, body, link string
	typ              byte
	mode             int64
}

func tarOf(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Size: int64(len(e.body))}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func newManager(t *testing.T) (*Manager, string) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m, err := Open(context.Background(), Config{Dir: filepath.Join(dir, "codebases"), Store: st, UIDShift: 100000, IDRange: 65536})
	if err != nil {
		t.Fatal(err)
	}
	return m, dir
}

func readTar(t *testing.T, data []byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		switch h.Typeflag {
		case tar.TypeDir:
			out[h.Name] = "<dir>"
		case tar.TypeSymlink:
			out[h.Name] = "-> " + h.Linkname
		default:
			out[h.Name] = string(b)
		}
	}
}

func TestCreateGetDownloadDelete(t *testing.T) {
	testutil.RequiresRoot(t) // chown to the sandbox range
	m, _ := newManager(t)
	ctx := context.Background()
	data := tarOf(t,
		ent{name: "src/", typ: tar.TypeDir, mode: 0o755},
		ent{name: "src/main.go", body: "package main\n"},
		ent{name: "big.bin", body: strings.Repeat("x", 100)},
		ent{name: ".wh.literal", body: "not a whiteout"},
		ent{name: "link", typ: tar.TypeSymlink, link: "src/main.go"},
		ent{name: "hard", typ: tar.TypeLink, link: "src/main.go"},
		ent{name: "fifo", typ: tar.TypeFifo},
		ent{name: "dev", typ: tar.TypeChar},
	)
	hdr := &sbxv1.CreateCodebaseHeader{Name: "proj", MaxFileBytes: 50, Skipped: []*sbxv1.SkippedFile{{Path: "client.iso", SizeBytes: 1 << 30, Reason: "larger than 10485760 bytes"}}}
	cb, skipped, err := m.Create(ctx, hdr, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cb.GetFileCount(), int64(3); got != want {
		t.Errorf("file count: got %d, want %d", got, want)
	}
	var sk []string
	for _, s := range skipped {
		sk = append(sk, s.GetPath())
	}
	if want := []string{"client.iso", "big.bin", "fifo", "dev"}; !slices.Equal(sk, want) {
		t.Errorf("skipped: got %v, want %v", sk, want)
	}
	got, err := m.Get(ctx, "proj")
	if err != nil {
		t.Fatal(err)
	}
	if got.GetId() != cb.GetId() || got.GetRevision() != 1 || len(got.GetSkipped()) != 4 {
		t.Errorf("get: got %v", got)
	}
	if _, _, err := m.Create(ctx, &sbxv1.CreateCodebaseHeader{Name: "proj"}, bytes.NewReader(tarOf(t))); !errdefs.IsAlreadyExists(err) {
		t.Errorf("duplicate name: got %v, want already exists", err)
	}
	var buf bytes.Buffer
	if err := m.Download(ctx, "proj", &buf); err != nil {
		t.Fatal(err)
	}
	files := readTar(t, buf.Bytes())
	want := map[string]string{"src/": "<dir>", "src/main.go": "package main\n", ".wh.literal": "not a whiteout", "link": "-> src/main.go", "hard": "package main\n"}
	for k, v := range want {
		if files[k] != v {
			t.Errorf("download %s: got %q, want %q", k, files[k], v)
		}
	}
	if _, ok := files["big.bin"]; ok {
		t.Errorf("download has the skipped big.bin")
	}
	if err := m.Delete(ctx, "proj"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Get(ctx, "proj"); !errdefs.IsNotFound(err) {
		t.Errorf("after delete: got %v, want not found", err)
	}
	if _, err := os.Stat(filepath.Join(m.treesDir(), cb.GetId())); !os.IsNotExist(err) {
		t.Errorf("tree left after delete: %v", err)
	}
}

func TestCreateRejectsHostileTar(t *testing.T) {
	testutil.RequiresRoot(t)
	tests := []struct {
		name string
		ents []ent
	}{
		{"dotdot", []ent{{name: "../../etc/passwd", body: "x"}}},
		{"symlink escape", []ent{{name: "d", typ: tar.TypeSymlink, link: "/tmp"}, {name: "d/evil", body: "x"}}},
		{"hardlink outside", []ent{{name: "h", typ: tar.TypeLink, link: "../../etc/shadow"}}},
		{"absolute name", []ent{{name: "/etc/passwd", body: "x"}}},
		{"write through an inside symlink", []ent{{name: "real/", typ: tar.TypeDir}, {name: "l", typ: tar.TypeSymlink, link: "real"}, {name: "l/f", body: "x"}}},
		{"duplicate name", []ent{{name: "a", body: "1"}, {name: "a", body: "2"}}},
		{"file over a symlink", []ent{{name: "a", typ: tar.TypeSymlink, link: "/etc/passwd"}, {name: "a", body: "x"}}},
		{"hardlink to a later file", []ent{{name: "h", typ: tar.TypeLink, link: "f"}, {name: "f", body: "x"}}},
		{"file named like a directory entry", []ent{{name: "f", body: "x"}, {name: "f/g", body: "y"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := newManager(t)
			_, _, err := m.Create(context.Background(), &sbxv1.CreateCodebaseHeader{}, bytes.NewReader(tarOf(t, tc.ents...)))
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("got %v, want invalid argument", err)
			}
			cbs, _ := m.List(context.Background())
			if len(cbs) != 0 {
				t.Errorf("codebases after a rejected upload: %v", cbs)
			}
			ents, _ := os.ReadDir(m.tmpDir())
			if len(ents) != 0 {
				t.Errorf("tmp dir not empty: %v", ents)
			}
		})
	}
	m, _ := newManager(t)
	m.cfg.MaxBytes = 10
	_, _, err := m.Create(context.Background(), &sbxv1.CreateCodebaseHeader{}, bytes.NewReader(tarOf(t, ent{name: "a", body: strings.Repeat("y", 11)})))
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "more than 10 bytes") {
		t.Errorf("over the size limit: got %v", err)
	}
}

func writeFile(t *testing.T, p, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

// TestMountSyncConflicts drives two mounts of one codebase through real
// overlay mounts: isolation, sync, conflict, force, repeated syncs, delete
// refused while mounted, and cleanup.
func TestMountSyncConflicts(t *testing.T) {
	testutil.RequiresRoot(t)
	m, _ := newManager(t)
	ctx := context.Background()
	cb, _, err := m.Create(ctx, &sbxv1.CreateCodebaseHeader{Name: "p"}, bytes.NewReader(tarOf(t,
		ent{name: "a.txt", body: "a1"}, ent{name: "b.txt", body: "b1"}, ent{name: "d/c.txt", body: "c1"}, ent{name: "gone/x", body: "x"})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Cleanup(context.Background(), nil) })
	mntA, err := m.Mount(ctx, "sb-a", &sbxv1.CodebaseMount{Codebase: "p"}, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	mntB, err := m.Mount(ctx, "sb-b", &sbxv1.CodebaseMount{Codebase: "p"}, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	ma, mb := overlayOf(t, mntA), overlayOf(t, mntB)
	if got := readFile(t, filepath.Join(ma, "d/c.txt")); got != "c1" {
		t.Fatalf("mounted content: got %q", got)
	}
	writeFile(t, filepath.Join(ma, "a.txt"), "a-from-A")
	writeFile(t, filepath.Join(ma, "new/n.txt"), "new")
	if err := os.RemoveAll(filepath.Join(ma, "gone")); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(mb, "a.txt")); got != "a1" {
		t.Errorf("B sees A's write: got %q", got)
	}
	if err := m.Delete(ctx, "p"); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("delete while mounted: got %v, want failed precondition", err)
	}

	dry, err := m.Sync(ctx, "sb-a", "", true, false)
	if err != nil {
		t.Fatal(err)
	}
	if dry.GetRevision() != 1 || !slices.Contains(dry.GetWritten(), "a.txt") {
		t.Errorf("dry run: got %v", dry)
	}
	resp, err := m.Sync(ctx, "sb-a", "", false, false)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetRevision() != 2 || len(resp.GetConflicts()) != 0 {
		t.Fatalf("sync A: got %v", resp)
	}
	slices.Sort(resp.Written)
	if want := []string{"a.txt", "new/", "new/n.txt"}; !slices.Equal(resp.GetWritten(), want) {
		t.Errorf("sync A written: got %v, want %v", resp.GetWritten(), want)
	}
	if want := []string{"gone", "gone/x"}; !slices.Equal(resp.GetDeleted(), want) {
		t.Errorf("sync A deleted: got %v, want %v", resp.GetDeleted(), want)
	}
	tree2 := m.tree(cb.GetId(), 2)
	if got := readFile(t, filepath.Join(tree2, "a.txt")); got != "a-from-A" {
		t.Errorf("revision 2 a.txt: got %q", got)
	}
	if _, err := os.Stat(filepath.Join(tree2, "gone")); !os.IsNotExist(err) {
		t.Errorf("revision 2 still has gone/: %v", err)
	}
	// Revision 1 (B's lower) is untouched.
	if got := readFile(t, filepath.Join(m.tree(cb.GetId(), 1), "a.txt")); got != "a1" {
		t.Errorf("revision 1 changed: a.txt = %q", got)
	}
	// Syncing again writes nothing and reports no conflict.
	again, err := m.Sync(ctx, "sb-a", "", false, false)
	if err != nil {
		t.Fatal(err)
	}
	if again.GetRevision() != 2 || len(again.GetWritten())+len(again.GetDeleted())+len(again.GetConflicts()) != 0 {
		t.Errorf("second sync of A: got %v", again)
	}

	// B changes a.txt too (conflict) and b.txt (no conflict).
	writeFile(t, filepath.Join(mb, "a.txt"), "a-from-B")
	writeFile(t, filepath.Join(mb, "b.txt"), "b-from-B")
	cr, err := m.Sync(ctx, "sb-b", "", false, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(cr.GetConflicts()) != 1 || cr.GetConflicts()[0].GetPath() != "a.txt" || cr.GetRevision() != 2 || len(cr.GetWritten()) != 0 {
		t.Fatalf("conflicting sync of B: got %v", cr)
	}
	if got := readFile(t, filepath.Join(m.tree(cb.GetId(), 2), "a.txt")); got != "a-from-A" {
		t.Errorf("conflict overwrote a.txt: %q", got)
	}
	if got := readFile(t, filepath.Join(m.tree(cb.GetId(), 2), "b.txt")); got != "b1" {
		t.Errorf("a refused sync wrote b.txt: %q", got)
	}
	// A writes again after its sync: its base for a.txt advanced, no conflict.
	writeFile(t, filepath.Join(ma, "a.txt"), "a-from-A-2")
	a2, err := m.Sync(ctx, "sb-a", "", false, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(a2.GetConflicts()) != 0 || a2.GetRevision() != 3 || !slices.Equal(a2.GetWritten(), []string{"a.txt"}) {
		t.Errorf("A's second change: got %v", a2)
	}
	// Forced, B wins.
	fr, err := m.Sync(ctx, "sb-b", "", false, true)
	if err != nil {
		t.Fatal(err)
	}
	if fr.GetRevision() != 4 || len(fr.GetConflicts()) != 1 {
		t.Errorf("forced sync of B: got %v", fr)
	}
	tree4 := m.tree(cb.GetId(), 4)
	for p, want := range map[string]string{"a.txt": "a-from-B", "b.txt": "b-from-B", "new/n.txt": "new"} {
		if got := readFile(t, filepath.Join(tree4, p)); got != want {
			t.Errorf("revision 4 %s: got %q, want %q", p, got, want)
		}
	}
	// A removes the directory it created and synced: overlayfs leaves no
	// whiteout (the lower layer never had it), the sync still deletes it.
	if err := os.RemoveAll(filepath.Join(ma, "new")); err != nil {
		t.Fatal(err)
	}
	vr, err := m.Sync(ctx, "sb-a", "", false, false)
	if err != nil {
		t.Fatal(err)
	}
	if vr.GetRevision() != 5 || len(vr.GetConflicts()) != 0 || !slices.Equal(vr.GetDeleted(), []string{"new", "new/n.txt"}) {
		t.Errorf("sync of a vanished directory: got %v", vr)
	}
	if _, err := os.Stat(filepath.Join(m.tree(cb.GetId(), 5), "new")); !os.IsNotExist(err) {
		t.Errorf("revision 5 still has new/: %v", err)
	}
	if again, err := m.Sync(ctx, "sb-a", "", false, false); err != nil || again.GetRevision() != 5 || len(again.GetDeleted()) != 0 {
		t.Errorf("sync after the vanished directory: %v %v", again, err)
	}
	// Old revisions only a mount uses are kept; others were collected.
	if _, err := os.Stat(m.tree(cb.GetId(), 2)); !os.IsNotExist(err) {
		t.Errorf("revision 2 not collected: %v", err)
	}
	if err := m.Unmount(ctx, "sb-a"); err != nil {
		t.Fatal(err)
	}
	if err := m.Unmount(ctx, "sb-b"); err != nil {
		t.Fatal(err)
	}
	if mounts, _ := hostmount.Under(m.mountsDir()); len(mounts) != 0 {
		t.Errorf("mounts left: %v", mounts)
	}
	if _, err := os.Stat(m.tree(cb.GetId(), 1)); !os.IsNotExist(err) {
		t.Errorf("revision 1 not collected after unmount: %v", err)
	}
	if err := m.Delete(ctx, "p"); err != nil {
		t.Errorf("delete after unmount: %v", err)
	}
}

func TestCleanupRemovesMountsOfGoneSandboxes(t *testing.T) {
	testutil.RequiresRoot(t)
	m, _ := newManager(t)
	ctx := context.Background()
	if _, _, err := m.Create(ctx, &sbxv1.CreateCodebaseHeader{Name: "p"}, bytes.NewReader(tarOf(t, ent{name: "f", body: "1"}))); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"sb-live", "sb-dead"} {
		if _, err := m.Mount(ctx, id, &sbxv1.CodebaseMount{Codebase: "p"}, 0); err != nil {
			t.Fatal(err)
		}
	}
	// A directory with a mount but no record (crash between mount and insert cannot happen, but be safe).
	if err := m.Cleanup(ctx, map[string]bool{"sb-live": true}); err != nil {
		t.Fatal(err)
	}
	mounts, _ := hostmount.Under(m.mountsDir())
	for _, mp := range mounts {
		if strings.Contains(mp, "sb-dead") {
			t.Errorf("mount of a gone sandbox left: %s", mp)
		}
	}
	if len(mounts) != 1 {
		t.Errorf("live sandbox mounts: got %v, want its rw tmpfs", mounts)
	}
	if paths, _ := m.MountPaths(ctx, "sb-dead"); len(paths) != 0 {
		t.Errorf("records of gone sandbox left: %v", paths)
	}
	if err := m.Cleanup(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if mounts, _ := hostmount.Under(m.mountsDir()); len(mounts) != 0 {
		t.Errorf("mounts left: %v", mounts)
	}
}

// overlayOf mounts a codebase mount's overlay in a temp dir as a driver
// would (without the driver's idmapped layers) and returns it.
func overlayOf(tb testing.TB, mnt runtime.Mount) string {
	tb.Helper()
	if mnt.Codebase == nil {
		tb.Fatalf("codebase mount %+v: no codebase", mnt)
	}
	dir := tb.TempDir()
	o := mnt.Codebase
	if err := overlay.Mount(dir, []string{o.Lower}, o.Upper, o.Work, "redirect_dir=off,metacopy=off,index=off", 0); err != nil {
		tb.Fatalf("mount codebase overlay: %v", err)
	}
	tb.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}
