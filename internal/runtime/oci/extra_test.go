//go:build linux

package oci_test

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"

	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/testsuite"
	"github.com/sbxdev/sbx/internal/testutil"
)

func TestInfo(t *testing.T) {
	testutil.RequiresRoot(t)
	d := newDriver(t, stateRoot(t))
	info := d.Info(context.Background())
	if !info.Healthy || info.Name != "oci" || info.Detail == "" {
		t.Errorf("Info = %+v, want healthy oci with a detail", info)
	}
	t.Logf("Info: %+v", info)
}

func TestRecoverPaused(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := stateRoot(t)
	ctx := context.Background()
	d := newDriver(t, dir)
	h := testsuite.Create(t, d, testsuite.NewSpec("paused"))
	if err := d.Pause(ctx, h); err != nil {
		t.Fatal(err)
	}
	d2 := newDriver(t, dir)
	h2, err := d2.Recover(ctx, h)
	if err != nil {
		t.Fatalf("Recover of a paused box: %v", err)
	}
	if err := d2.Resume(ctx, h2); err != nil {
		t.Fatal(err)
	}
	if res := testsuite.MustExec(t, d2, h2, "echo", "ok"); res.Stdout != "ok\n" {
		t.Errorf("echo after recover+resume: %q", res.Stdout)
	}
}

// TestCleanupAfterCrash leaves the debris of interrupted creates and
// destroys behind and checks Cleanup removes all of it.
func TestCleanupAfterCrash(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := stateRoot(t)
	ctx := context.Background()
	d := newDriver(t, dir)
	live := testsuite.NewSpec("live")
	h, err := d.Create(ctx, live)
	if err != nil {
		t.Fatal(err)
	}
	// A box dir with a mounted writable layer but no container.
	rw := filepath.Join(dir, "boxes", "crashed-create", "rw")
	if err := os.MkdirAll(rw, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", rw, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	// A cgroup with no box dir (crash in the middle of a destroy).
	cg := filepath.Join("/sys/fs/cgroup/memory", cgroupParent(dir), "crashed-destroy")
	if _, err := os.Stat("/sys/fs/cgroup/memory"); err != nil {
		cg = filepath.Join("/sys/fs/cgroup", cgroupParent(dir), "crashed-destroy")
	}
	if err := os.MkdirAll(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	// A live box whose handle the daemon lost (e.g. not committed to its store).
	if err := d.Cleanup(ctx, map[string]bool{}); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	checkNoLeftovers(t, d, dir)
	if err := d.Destroy(ctx, h); err != nil {
		t.Errorf("Destroy after Cleanup: %v", err)
	}
}

func TestConcurrentDestroy(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := stateRoot(t)
	ctx := context.Background()
	d := newDriver(t, dir)
	var hs []runtime.Handle
	for i := 0; i < 4; i++ {
		h, err := d.Create(ctx, testsuite.NewSpec("conc"))
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	var wg sync.WaitGroup
	durs := make([]time.Duration, len(hs))
	start := time.Now()
	for i, h := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			if err := d.Destroy(ctx, h); err != nil {
				t.Errorf("Destroy(%s): %v", h.ID, err)
			}
			durs[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	sort.Slice(durs, func(i, j int) bool { return durs[i] < durs[j] })
	t.Logf("4 concurrent destroys: total %v, each %v", time.Since(start), durs)
	checkNoLeftovers(t, d, dir)
}

// TestImageLayers boots a box from two plain directory layers (no shell: the
// agent is static), checks their stacking order and that a hostile absolute
// /etc symlink in a layer never makes the driver write to the host.
func TestImageLayers(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := stateRoot(t)
	ctx := context.Background()
	d := newDriver(t, dir)
	base := filepath.Dir(dir)
	hostEtc := filepath.Join(base, "host-etc")
	l1, l2 := filepath.Join(base, "layer1"), filepath.Join(base, "layer2")
	for _, p := range []string{hostEtc, l1 + "/proc", l1 + "/sys", l1 + "/dev", l1 + "/tmp", l2} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(hostEtc, filepath.Join(l1, "etc")); err != nil {
		t.Fatal(err)
	}
	for layer, content := range map[string]string{l1: "lower", l2: "upper"} {
		if err := os.WriteFile(filepath.Join(layer, "which"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	spec := testsuite.NewSpec("layers")
	spec.Image = runtime.Image{Ref: "test", Layers: []runtime.Layer{{Dir: l1}, {Dir: l2}}}
	h := testsuite.Create(t, d, spec)
	if ents, _ := os.ReadDir(hostEtc); len(ents) > 0 {
		t.Errorf("Create wrote through the layer's /etc symlink into the host: %v", names(ents))
	}
	c := testsuite.Conn(d, h)
	defer c.Close()
	stream, err := c.ReadFile(ctx, connect.NewRequest(&sbxv1.ReadFileRequest{Path: "/which"}))
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	for stream.Receive() {
		got = append(got, stream.Msg().GetData()...)
	}
	if err := stream.Err(); err != nil || string(got) != "upper" {
		t.Errorf("/which = %q (%v), want the upper layer's %q", got, err, "upper")
	}
	if res := testsuite.MustExec(t, d, h, "/.sbx/sbx-agent", "--version"); res.ExitCode != 0 {
		t.Errorf("agent --version in the box: %+v", res)
	}
}
