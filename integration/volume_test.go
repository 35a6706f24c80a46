package integration

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

func wantCode(t *testing.T, what string, err error, code connect.Code) {
	t.Helper()
	var se *sbx.Error
	if !errors.As(err, &se) || se.Code != code {
		t.Fatalf("%s: got %v, want %v", what, err, code)
	}
}

func TestVolumes(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	c := d.client()
	if _, err := c.CreateVolume(ctx, "data", 32<<20); err != nil {
		t.Fatal(err)
	}
	volDir := filepath.Join(d.dataDir, "volumes", "data")
	image := filepath.Join(volDir, "image")

	for _, p := range []string{"relative", "/", "/proc/x", "/sys", "/dev/v", "/.sbx/v", "/a/../b"} {
		_, err := c.Create(ctx, sbx.CreateOptions{Volumes: []sbx.VolumeMount{{Volume: "data", Path: p}}})
		wantCode(t, "mount at "+p, err, connect.CodeInvalidArgument)
	}
	_, err := c.Create(ctx, sbx.CreateOptions{Volumes: []sbx.VolumeMount{{Volume: "nope", Path: "/v"}}})
	wantCode(t, "unknown volume", err, connect.CodeNotFound)

	a, err := c.Create(ctx, sbx.CreateOptions{Volumes: []sbx.VolumeMount{{Volume: "data", Path: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(a.ID)
	mustRun(t, ctx, a, "echo persisted > /data/f.txt && sync")
	b, err := c.Create(ctx, sbx.CreateOptions{Volumes: []sbx.VolumeMount{{Volume: "data", Path: "/mnt/ro", ReadOnly: true}}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(b.ID)
	if got := mustRun(t, ctx, b, "cat /mnt/ro/f.txt"); got != "persisted\n" {
		t.Fatalf("read from B: %q", got)
	}
	res, err := b.RunShell(ctx, "echo x > /mnt/ro/g.txt")
	if err != nil {
		t.Fatal(err)
	}
	if res.Code == 0 || !strings.Contains(string(res.Stderr), "Read-only file system") {
		t.Fatalf("write to ro mount: exit %d, stderr %q", res.Code, res.Stderr)
	}
	if len(b.Info.GetVolumes()) != 1 || !b.Info.GetVolumes()[0].GetReadOnly() {
		t.Errorf("sandbox volumes: %v", b.Info.GetVolumes())
	}

	// Quota: writing beyond the size fails with ENOSPC.
	res, err = a.RunShell(ctx, "dd if=/dev/zero of=/data/big bs=1M count=64 2>&1; rm -f /data/big")
	if err != nil {
		t.Fatal(err)
	}
	if res.Code == 0 && !strings.Contains(string(res.Stdout), "No space left on device") {
		t.Fatalf("dd beyond quota: exit %d, out %q", res.Code, res.Stdout)
	}
	if !strings.Contains(string(res.Stdout), "No space left on device") {
		t.Fatalf("dd beyond quota: out %q, want ENOSPC", res.Stdout)
	}

	err = c.RemoveVolume(ctx, "data")
	wantCode(t, "rm in use", err, connect.CodeFailedPrecondition)
	if !strings.Contains(err.Error(), a.ID) && !strings.Contains(err.Error(), b.ID) {
		t.Errorf("rm in use: %v does not name a sandbox", err)
	}
	v, err := c.GetVolume(ctx, "data")
	if err != nil {
		t.Fatal(err)
	}
	if len(v.GetSandboxes()) != 2 || v.GetUsedBytes() <= 0 || v.GetSizeBytes() != 32<<20 {
		t.Errorf("volume: %v", v)
	}

	for _, s := range []*sbx.Sandbox{a, b} {
		if err := s.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	d.stop()
	d.start()
	cc, err := c.Create(ctx, sbx.CreateOptions{Volumes: []sbx.VolumeMount{{Volume: "data", Path: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(cc.ID)
	if got := mustRun(t, ctx, cc, "cat /data/f.txt"); got != "persisted\n" {
		t.Fatalf("after restart: %q", got)
	}
	if err := cc.Destroy(ctx); err != nil {
		t.Fatal(err)
	}

	vs, err := c.ListVolumes(ctx)
	if err != nil || len(vs) != 1 {
		t.Fatalf("list: %v %v", vs, err)
	}
	if err := c.RemoveVolume(ctx, "data"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(volDir); !os.IsNotExist(err) {
		t.Errorf("volume dir left: %v", err)
	}
	if out, _ := exec.Command("losetup", "-j", image).CombinedOutput(); len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("loop device left: %s", out)
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), volDir) {
		t.Errorf("mount left under %s", volDir)
	}
	_, err = c.GetVolume(ctx, "data")
	wantCode(t, "get removed", err, connect.CodeNotFound)
}
