package testsuite

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/sbxdev/sbx/internal/runtime"
)

// testSnapshot: Diff writes what the box changed as an OCI layer: a new
// file, a symlink (as a symlink), a new directory, a file in /tmp, a file a
// running process wrote and still holds open, and not the files the driver
// writes into every box; the box serves again afterwards, and a paused box
// can be diffed too.
func testSnapshot(t *testing.T, d runtime.Driver, c Config) {
	snap, ok := d.(runtime.Snapshotter)
	if !ok {
		t.Fatalf("driver %s advertises \"snapshot\" but does not implement runtime.Snapshotter", d.Name())
	}
	ctx := ctxT(t)
	h := Create(t, d, c.spec("snap"))
	script := `set -e
echo data > /root/f
ln -s /etc/passwd /root/l
mkdir /opt/new
echo t > /tmp/t
/usr/bin/python3 -c 'import os, time
f = open("/root/open", "w")
f.write("held")
f.flush()
os.close(1); os.close(2)
time.sleep(60)' >/dev/null 2>&1 &
while [ "$(cat /root/open 2>/dev/null)" != held ]; do sleep 0.05; done`
	if r := MustExec(t, d, h, "/bin/sh", "-c", script); r.ExitCode != 0 {
		t.Fatalf("changing the box: %+v", r)
	}
	diff := func() map[string]*tar.Header {
		t.Helper()
		var buf bytes.Buffer
		if err := snap.Diff(ctx, h, &buf, runtime.DiffLimits{}); err != nil {
			t.Fatalf("Diff: %v", err)
		}
		got := map[string]*tar.Header{}
		tr := tar.NewReader(&buf)
		for {
			hdr, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("reading the layer: %v", err)
			}
			b, _ := io.ReadAll(tr)
			hdr.PAXRecords = map[string]string{"content": string(b)}
			got[strings.TrimSuffix(hdr.Name, "/")] = hdr
		}
		return got
	}
	got := diff()
	for _, w := range []struct {
		name     string
		typ      byte
		content  string
		linkname string
	}{
		{"root/f", tar.TypeReg, "data\n", ""},
		{"root/l", tar.TypeSymlink, "", "/etc/passwd"},
		{"opt/new", tar.TypeDir, "", ""},
		{"tmp/t", tar.TypeReg, "t\n", ""},
		{"root/open", tar.TypeReg, "held", ""},
	} {
		hdr := got[w.name]
		if hdr == nil {
			t.Errorf("layer lacks %s", w.name)
			continue
		}
		if hdr.Typeflag != w.typ || hdr.PAXRecords["content"] != w.content || hdr.Linkname != w.linkname {
			t.Errorf("%s in the layer: type %c, content %q, link %q; want type %c, content %q, link %q",
				w.name, hdr.Typeflag, hdr.PAXRecords["content"], hdr.Linkname, w.typ, w.content, w.linkname)
		}
	}
	for name := range got {
		if name == "etc/hostname" || name == "etc/hosts" || name == ".sbx" || strings.HasPrefix(name, ".sbx/") {
			t.Errorf("layer holds %s, which the driver writes into every box", name)
		}
	}
	if err := Hello(ctx, d, h); err != nil {
		t.Fatalf("Hello after Diff: %v", err)
	}
	if !HasCapability(d, "pause") {
		return
	}
	if err := d.Pause(ctx, h); err != nil {
		t.Fatal(err)
	}
	if got := diff(); got["root/f"] == nil {
		t.Errorf("Diff of the paused box lacks root/f")
	}
	if err := d.Resume(ctx, h); err != nil {
		t.Fatal(err)
	}
	if err := Hello(ctx, d, h); err != nil {
		t.Errorf("Hello after diffing a paused box and resuming it: %v", err)
	}
}
