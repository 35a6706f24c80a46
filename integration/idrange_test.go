package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// idMapDir is where the oci driver records the host id ranges boxes hold
// (idmap.DefaultDir): one file per slot, naming its box dir.
const idMapDir = "/run/sbx/idmap"

// boxRange is the first host uid of a box's own id range, as the box's
// user namespace maps it ("0 <base> 65536"), read from the host: inside,
// the box sees its ids map to the canonical range (its user namespace's
// parent shows the box's range as that). The box must agree.
func boxRange(t *testing.T, ctx context.Context, d *daemon, sb *sbx.Sandbox) uint32 {
	t.Helper()
	if got, want := mustRun(t, ctx, sb, "cat /proc/self/uid_map /proc/self/gid_map | tr -s ' '"), " 0 100000 65536\n 0 100000 65536\n"; got != want {
		t.Fatalf("box %s: its uid and gid maps: got %q, want %q", sb.ID, got, want)
	}
	pid, err := os.ReadFile(filepath.Join(d.dataDir, "oci", "boxes", sb.ID, "init.pid"))
	if err != nil {
		t.Fatalf("box %s: %v", sb.ID, err)
	}
	var base uint32
	for _, f := range []string{"uid_map", "gid_map"} {
		m, err := os.ReadFile(filepath.Join("/proc", strings.TrimSpace(string(pid)), f))
		if err != nil {
			t.Fatalf("box %s: %v", sb.ID, err)
		}
		fs := strings.Fields(string(m))
		if len(fs) != 3 || fs[0] != "0" || fs[2] != "65536" {
			t.Fatalf("box %s: %s %q, want 0 <base> 65536", sb.ID, f, m)
		}
		b, err := strconv.ParseUint(fs[1], 10, 32)
		if err != nil || b < 1<<28 {
			t.Fatalf("box %s: %s %q: base %s, want the box's own range from 2^28", sb.ID, f, m, fs[1])
		}
		if base != 0 && uint32(b) != base {
			t.Fatalf("box %s: uid and gid maps differ", sb.ID)
		}
		base = uint32(b)
	}
	return base
}

// heldRanges lists the ranges recorded for boxes of d: box id -> first uid.
func heldRanges(t *testing.T, d *daemon) map[string]uint32 {
	t.Helper()
	ents, err := os.ReadDir(idMapDir)
	if err != nil {
		t.Fatalf("list id ranges: %v", err)
	}
	boxes := filepath.Join(d.dataDir, "oci", "boxes") + "/"
	out := map[string]uint32{}
	for _, e := range ents {
		slot, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil {
			continue
		}
		owner, err := os.ReadFile(filepath.Join(idMapDir, e.Name()))
		if err != nil {
			continue // freed meanwhile (another daemon's box)
		}
		if id, ok := strings.CutPrefix(string(owner), boxes); ok {
			out[id] = 1<<28 + uint32(slot)*65536
		}
	}
	return out
}

// TestIDRangesSurviveDaemonRestart: each box runs in a host uid range of its
// own, recorded host-wide and in the box's handle. A daemon that stops
// gracefully or is killed with SIGKILL and comes back must keep every live
// box's range (the box keeps running in it and keeps working: its own
// files, an image layer, a volume and a codebase, all idmapped into it),
// must never hand a live box's range to a new box, and frees a range only
// once its box is destroyed.
func TestIDRangesSurviveDaemonRestart(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 4*time.Minute)
	c := d.client()
	if _, err := c.CreateVolume(ctx, "ids", 16<<20); err != nil {
		t.Fatal(err)
	}
	// After the boxes (cleanups run last first): volumes outlive daemons.
	t.Cleanup(func() {
		if err := c.RemoveVolume(context.Background(), "ids"); err != nil {
			t.Errorf("remove volume: %v", err)
		}
	})
	src := t.TempDir()
	writeTree(t, src, map[string]string{"README": "hi\n"})
	if _, err := c.CreateCodebase(ctx, src, sbx.UploadOptions{Name: "ids"}); err != nil {
		t.Fatal(err)
	}

	// live: every box that should be running, with its range.
	live := map[string]*sbx.Sandbox{}
	ranges := map[string]uint32{}
	add := func(opts sbx.CreateOptions) *sbx.Sandbox {
		t.Helper()
		sb := newBox(t, ctx, d, opts)
		base := boxRange(t, ctx, d, sb)
		for id, other := range ranges {
			if other == base {
				t.Fatalf("new box %s got range %d, which live box %s holds", sb.ID, base, id)
			}
		}
		// A file of its own, and a process that must outlive restarts.
		mustRun(t, ctx, sb, "echo mine > /root/own && sleep 100000 >/dev/null 2>&1 &")
		live[sb.ID], ranges[sb.ID] = sb, base
		return sb
	}
	add(sbx.CreateOptions{})
	add(sbx.CreateOptions{})
	vol := add(sbx.CreateOptions{Volumes: []sbx.VolumeMount{{Volume: "ids", Path: "/data"}}})
	cb := add(sbx.CreateOptions{Codebases: []sbx.CodebaseMount{{Codebase: "ids"}}})
	mustRun(t, ctx, vol, "echo v > /data/f")
	mustRun(t, ctx, cb, "echo c >> /workspace/README")

	check := func(when string) {
		t.Helper()
		held := heldRanges(t, d)
		for id, sb := range live {
			if got := boxRange(t, ctx, d, sb); got != ranges[id] {
				t.Errorf("%s: box %s runs in range %d, want %d as before", when, id, got, ranges[id])
			}
			if held[id] != ranges[id] {
				t.Errorf("%s: box %s: range recorded %d, want %d (held: %v)", when, id, held[id], ranges[id], held)
			}
			// Its own file and a copy-up of an image file, as its root; its
			// process survived.
			want := "mine\n0:0\n0:0\n1\n"
			got := mustRun(t, ctx, sb, "cat /root/own; stat -c %u:%g /root/own; echo x >> /etc/hosts && stat -c %u:%g /etc/hosts; pgrep -c sleep")
			if got != want {
				t.Errorf("%s: box %s: got %q, want %q", when, id, got, want)
			}
		}
		if got := mustRun(t, ctx, vol, "cat /data/f; echo w > /data/g; stat -c %u:%g /data/g"); got != "v\n0:0\n" {
			t.Errorf("%s: volume in box %s: got %q", when, vol.ID, got)
		}
		if got := mustRun(t, ctx, cb, "cat /workspace/README; touch /workspace/n; stat -c %u:%g /workspace/n"); got != "hi\nc\n0:0\n" {
			t.Errorf("%s: codebase in box %s: got %q", when, cb.ID, got)
		}
		for id := range held {
			if _, ok := live[id]; !ok {
				t.Errorf("%s: range %d still held for box %s, which is gone", when, held[id], id)
			}
		}
		// New boxes never get a live box's range.
		for range 3 {
			add(sbx.CreateOptions{})
		}
	}
	check("before any restart")

	d.stop()
	d.start()
	check("after a graceful restart")

	d.kill9()
	d.start()
	check("after kill -9")

	// A range is freed when its destroyed box is torn down (the destroy
	// answers first), and only then.
	n := 0
	for id, sb := range live {
		if n++; n > 4 {
			break
		}
		if err := sb.Destroy(ctx); err != nil {
			t.Fatalf("destroy %s: %v", id, err)
		}
		delete(live, id)
		// Destroy answers before its teardown, which frees the range last.
		var held map[string]uint32
		waitUntil(t, 30*time.Second, func() bool {
			held = heldRanges(t, d)
			_, ok := held[id]
			return !ok
		}, func() string { return fmt.Sprintf("range %d of destroyed box %s still held", held[id], id) })
		for other := range live {
			if held[other] != ranges[other] {
				t.Errorf("after destroying %s: live box %s: range recorded %d, want %d", id, other, held[other], ranges[other])
			}
		}
	}
}
