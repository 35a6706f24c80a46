package integration

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestSDKHandles: the Go SDK's file objects, CreateFromLocal (guarded
// view-only by default) and handles that Close only what they created.
func TestSDKHandles(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	c := d.client()

	t.Run("open-file", func(t *testing.T) {
		sb, err := c.Create(ctx, sbx.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		d.remember(sb.ID)
		defer sb.Close(ctx)
		p := "/tmp/o/f.txt"
		f, err := sb.OpenFile(ctx, p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if got := mustRun(t, ctx, sb, "stat -c %s:%a "+p); got != "0:600\n" {
			t.Errorf("after O_CREATE|O_TRUNC: size:mode %q, want 0:600 (made at open)", got)
		}
		f.WriteString("one\n")
		f.WriteString("two\n")
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if got := mustRun(t, ctx, sb, "cat "+p); got != "one\ntwo\n" {
			t.Errorf("after Close: %q, want one two", got)
		}
		f, err = sb.OpenFile(ctx, p, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString("three\n")
		if err := f.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		f.WriteString("four\n")
		f.Close()
		r, err := sb.Open(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r)
		if string(b) != "one\ntwo\nthree\nfour\n" {
			t.Errorf("read back: %q", b)
		}
		if _, err := r.Write([]byte("x")); err == nil {
			t.Error("Write on a read-only file succeeded")
		}
		r.Close()
		rw, err := sb.OpenFile(ctx, p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		rw.Seek(0, io.SeekStart)
		rw.Write([]byte("O"))
		rw.Close()
		if got, _ := sb.ReadFile(ctx, p); !bytes.HasPrefix(got, []byte("One\ntwo")) {
			t.Errorf("after O_RDWR write at 0: %q", got)
		}
		if _, err := sb.OpenFile(ctx, p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0); !sbx.IsAlreadyExists(err) {
			t.Errorf("O_EXCL on an existing file: got %v, want AlreadyExists", err)
		}
		if _, err := sb.Open(ctx, "/tmp/o/missing"); !sbx.IsNotFound(err) {
			t.Errorf("Open of a missing file: got %v, want NotFound", err)
		}
	})

	t.Run("errors-name-things-once", func(t *testing.T) {
		sb, err := c.Create(ctx, sbx.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		d.remember(sb.ID)
		defer sb.Close(ctx)
		calls := map[string]func() error{
			"read":     func() error { _, err := sb.ReadFile(ctx, "/nope"); return err },
			"stat":     func() error { _, err := sb.Stat(ctx, "/nope"); return err },
			"list":     func() error { _, err := sb.ListDir(ctx, "/nope", false, 0); return err },
			"remove":   func() error { return sb.Remove(ctx, "/nope", false) },
			"mkdir":    func() error { return sb.MakeDir(ctx, "/nope/a", false) },
			"rename":   func() error { return sb.Rename(ctx, "/nope", "/x") },
			"download": func() error { return sb.DownloadTar(ctx, "/nope", io.Discard) },
			"upload":   func() error { _, err := sb.UploadTar(ctx, "/etc/hostname", bytes.NewReader(nil)); return err },
			"snapshot": func() error { _, err := sb.Snapshot(ctx, "BAD REF"); return err },
			"image":    func() error { _, err := c.Create(ctx, sbx.CreateOptions{Image: "nope/nope:1"}); return err },
		}
		for name, call := range calls {
			err := call()
			if err == nil {
				t.Errorf("%s: succeeded", name)
				continue
			}
			msg := err.Error()
			segs := strings.Split(msg, ": ")
			for i := 1; i < len(segs); i++ {
				if segs[i] == segs[i-1] {
					t.Errorf("%s: %q repeats %q", name, msg, segs[i])
				}
			}
			if strings.Count(msg, "/nope ")+strings.Count(msg, "/nope:") > 1 || strings.Count(msg, sb.ID) > 1 {
				t.Errorf("%s: %q names the path or sandbox twice", name, msg)
			}
		}
	})

	t.Run("from-local-and-ownership", func(t *testing.T) {
		src := t.TempDir()
		writeTree(t, src, map[string]string{"app.py": "print('app')\n"})
		sb, err := c.CreateFromLocal(ctx, src, sbx.FromLocalOptions{})
		if err != nil {
			t.Fatal(err)
		}
		d.remember(sb.ID)
		if !sb.Owned() {
			t.Error("CreateFromLocal: not owned")
		}
		if got := mustRun(t, ctx, sb, "ls /workspace"); got != "app.py\n" {
			t.Errorf("ls /workspace: %q, want app.py (names are visible)", got)
		}
		res, err := sb.RunShell(ctx, "cat /workspace/app.py")
		if err != nil {
			t.Fatal(err)
		}
		if res.Code == 0 || !strings.Contains(string(res.Stderr), "Permission denied") {
			t.Errorf("cat in a view-only mount: exit %d, %q; want permission denied", res.Code, res.Stderr)
		}
		cbs, _ := c.ListCodebases(ctx)
		if len(cbs) != 1 {
			t.Fatalf("codebases: %d, want 1", len(cbs))
		}
		// Other handles on the box own nothing.
		found, err := c.Get(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		list, _ := c.List(ctx)
		for _, h := range []*sbx.Sandbox{found, list[0], c.Sandbox(sb.ID)} {
			if h.Owned() {
				t.Errorf("a found handle is owned")
			}
			if err := h.Close(ctx); err != nil {
				t.Errorf("Close of a found handle: %v", err)
			}
		}
		if err := sb.Refresh(ctx); err != nil {
			t.Fatalf("after closing found handles the sandbox is gone: %v", err)
		}
		if err := sb.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Get(ctx, sb.ID); !sbx.IsNotFound(err) {
			t.Errorf("after the owner's Close: %v, want NotFound", err)
		}
		if _, err := c.GetCodebase(ctx, cbs[0].GetId()); !sbx.IsNotFound(err) {
			t.Errorf("the codebase after Close: %v, want NotFound", err)
		}
	})

	t.Run("rules-alone-start-view-only", func(t *testing.T) {
		src := t.TempDir()
		writeTree(t, src, map[string]string{"app.py": "print('app')\n", "other.py": "x\n"})
		resp, err := c.CreateCodebase(ctx, src, sbx.UploadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		id := resp.GetCodebase().GetId()
		defer c.DeleteCodebase(ctx, id)
		for _, tc := range []struct {
			name  string
			mount sbx.CodebaseMount
			want  string
		}{
			{"rules only", sbx.CodebaseMount{Codebase: id, Rules: []sbx.PermissionRule{{Pattern: "app.py", Permission: sbx.PermRead}}},
				"print('app')\nno-other no-write\n"},
			{"unguarded", sbx.CodebaseMount{Codebase: id}, "print('app')\nx\nwrote\n"},
		} {
			sb, err := c.Create(ctx, sbx.CreateOptions{Codebases: []sbx.CodebaseMount{tc.mount}})
			if err != nil {
				t.Fatal(err)
			}
			d.remember(sb.ID)
			got := mustRun(t, ctx, sb, `cd /workspace; cat app.py; (cat other.py 2>/dev/null || printf 'no-other ') ; (echo y > new.py 2>/dev/null && echo wrote || echo no-write)`)
			if got != tc.want {
				t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
			}
			sb.Close(ctx)
		}
	})
}
