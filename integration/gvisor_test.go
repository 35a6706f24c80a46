package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// runscForTests is the runsc scripts/install-runsc.sh built; tests of the
// gvisor runtime skip, saying so, without it.
func runscForTests(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SBX_RUNSC"); p != "" {
		return p
	}
	p, err := filepath.Abs("../.tools/runsc")
	if err == nil {
		if _, err = os.Stat(p); err == nil {
			return p
		}
	}
	t.Skipf("runsc not found (%v): run scripts/install-runsc.sh or set SBX_RUNSC", err)
	return ""
}

// TestGvisorRuntime drives a real daemon with both runtimes: the gvisor
// tier is listed with its health and capabilities, a sandbox is created on
// it per request and runs on gVisor's kernel next to an oci one, shares a
// volume with it, stops and starts, is snapshotted into an image both
// runtimes run, survives a daemon kill -9 (recovered through its own
// driver), and what it lacks is refused by capability, naming the runtime,
// leaving nothing behind.
func TestGvisorRuntime(t *testing.T) {
	runsc := runscForTests(t)
	d := startDaemon(t, "--runsc", runsc)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, _, code := d.cli("", "info")
	if code != 0 || !strings.Contains(out, "runtime gvisor: healthy: runsc v0.0.0-") ||
		!strings.Contains(out, "runtime oci (default): healthy") || !strings.Contains(out, "capabilities: pause,") {
		t.Fatalf("sbx info: exit %d\n%s\nwant both runtimes healthy with their capabilities, oci the default", code, out)
	}

	c := d.client()
	if _, err := c.CreateVolume(ctx, "shared", 32<<20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // on failure too: a volume stays mounted while it exists
		ctx := context.Background()
		if list, err := d.client().List(ctx); err == nil {
			for _, sb := range list {
				_ = sb.Destroy(ctx)
			}
		}
		_ = d.client().RemoveVolume(ctx, "shared")
	})
	vol := []sbx.VolumeMount{{Volume: "shared", Path: "/data"}}
	gv, err := c.Create(ctx, sbx.CreateOptions{Runtime: "gvisor", Volumes: vol})
	if err != nil {
		t.Fatalf("create on gvisor: %v", err)
	}
	d.remember(gv.Info.GetId())
	oc, err := c.Create(ctx, sbx.CreateOptions{Volumes: vol})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(oc.Info.GetId())
	if got := gv.Info.GetRuntime(); got != "gvisor" {
		t.Errorf("runtime of the gvisor sandbox = %q, want gvisor", got)
	}
	if got := oc.Info.GetRuntime(); got != "oci" {
		t.Errorf("runtime of the default sandbox = %q, want oci", got)
	}
	if out, _, _ := d.cli("", "inspect", gv.Info.GetId()); !strings.Contains(out, `"runtime": "gvisor"`) {
		t.Errorf("sbx inspect does not show the gvisor runtime:\n%s", out)
	}
	// /proc/version, not dmesg: the boxes' seccomp profile refuses
	// syslog on both runtimes.
	kernel := func(sb *sbx.Sandbox) string {
		r, err := sb.Run(ctx, "cat", "/proc/version")
		if err != nil {
			t.Fatalf("cat /proc/version: %v", err)
		}
		return string(r.Stdout)
	}
	if k := kernel(gv); !strings.Contains(k, "gvisor") {
		t.Errorf("/proc/version in the gvisor sandbox = %q, want gVisor's", k)
	}
	if k := kernel(oc); strings.Contains(k, "gvisor") {
		t.Errorf("the oci sandbox runs on gVisor: %q", k)
	}
	if r, err := gv.Run(ctx, "sh", "-c", "echo from-gvisor > /data/f"); err != nil || r.Code != 0 {
		t.Fatalf("write to the volume from gvisor: %v %+v", err, r)
	}
	if r, err := oc.Run(ctx, "cat", "/data/f"); err != nil || string(r.Stdout) != "from-gvisor\n" {
		t.Errorf("the oci sandbox reads %q (%v), want what the gvisor one wrote", r.Stdout, err)
	}

	if err := gv.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if err := gv.Start(ctx); err != nil {
		t.Fatalf("start: %v", err)
	}
	if err := gv.WriteFile(ctx, "/root/mark", []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}

	// What gvisor lacks is refused by name, before anything is made.
	before, _ := c.List(ctx)
	for name, opts := range map[string]sbx.CreateOptions{
		"path-policies": {Runtime: "gvisor", PathPolicies: []sbx.PathPolicy{{Path: "/work", Preset: "read-only"}}},
	} {
		_, err := c.Create(ctx, opts)
		if !sbx.IsFailedPrecondition(err) || !strings.Contains(err.Error(), `runtime "gvisor"`) || !strings.Contains(err.Error(), name) {
			t.Errorf("create needing %s on gvisor: got %v, want FailedPrecondition naming the runtime and %q", name, err, name)
		}
	}
	if after, _ := c.List(ctx); len(after) != len(before) {
		t.Errorf("refused creates left sandboxes: %d before, %d after", len(before), len(after))
	}

	// A snapshot of the gvisor sandbox is an image both runtimes run:
	// its disk and its /tmp are in it.
	if r, err := gv.RunShell(ctx, "echo in-tmp > /tmp/t"); err != nil || r.Code != 0 {
		t.Fatalf("write /tmp/t: %v %+v", err, r)
	}
	if _, err := gv.Snapshot(ctx, "local/gv:1"); err != nil {
		t.Fatalf("snapshot of a gvisor sandbox: %v", err)
	}
	for _, rt := range []string{"gvisor", "oci"} {
		from, err := c.Create(ctx, sbx.CreateOptions{Runtime: rt, Image: "local/gv:1"})
		if err != nil {
			t.Fatalf("create on %s from the gvisor snapshot: %v", rt, err)
		}
		d.remember(from.Info.GetId())
		if r, err := from.RunShell(ctx, "cat /root/mark /tmp/t"); err != nil || string(r.Stdout) != "keptin-tmp\n" {
			t.Errorf("%s sandbox from the gvisor snapshot reads %q (%v), want the snapshotted /root/mark and /tmp/t", rt, r.Stdout, err)
		}
		if err := from.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// A daemon killed hard recovers the gvisor sandbox through its own driver.
	d.kill9()
	d.start()
	c = d.client()
	again, err := c.Get(ctx, gv.Info.GetId())
	if err != nil {
		t.Fatalf("get after restart: %v", err)
	}
	if b, err := again.ReadFile(ctx, "/root/mark"); err != nil || string(b) != "kept" {
		t.Errorf("after restart the gvisor sandbox reads %q, %v; want \"kept\"", b, err)
	}
	for _, sb := range []*sbx.Sandbox{again, oc} {
		if err := sb.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.RemoveVolume(ctx, "shared"); err != nil {
		t.Fatal(err)
	}
	d.assertNoLeaks()
	d.stop()
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), d.dataDir) {
		t.Errorf("mounts under the data dir after the daemon stopped:\n%s", mi)
	}
	d.start()
}
