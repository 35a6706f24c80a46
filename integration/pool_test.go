package integration

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// waitPool waits until n warm boxes exist besides the live sandboxes.
func (d *daemon) waitPool(t *testing.T, n int, live ...string) {
	t.Helper()
	keep := map[string]bool{}
	for _, id := range live {
		keep[id] = true
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		boxes, _ := filepath.Glob(filepath.Join(d.dataDir, "oci", "boxes", "sb-*"))
		warm := 0
		for _, b := range boxes {
			if !keep[filepath.Base(b)] {
				warm++
			}
		}
		if warm >= n {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("warm pool did not reach %d boxes", n)
}

func TestWarmPool(t *testing.T) {
	d := startDaemon(t, "--warm-pool", "2")
	ctx := ctxT(t, 3*time.Minute)
	c := d.client()
	d.waitPool(t, 2)

	// A sandbox taken from the pool gets everything it asked for.
	sb, err := c.Create(ctx, sbx.CreateOptions{
		Name: "warm", Env: map[string]string{"COLOR": "blue"}, Secrets: map[string]string{"KEY": "k1"},
		Workdir: "/srv/app", Command: []string{"sh", "-c", "echo started > /tmp/entry; sleep 1000"},
		MemoryBytes: 96 << 20, DiskBytes: 24 << 20, Pids: 100,
	})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	out := mustRun(t, ctx, sb, `echo "$COLOR $KEY $(pwd) $(hostname) $SBX_SANDBOX_ID"; sleep 0.2; cat /tmp/entry`)
	if want := "blue k1 /srv/app " + sb.ID + " " + sb.ID + "\nstarted\n"; out != want {
		t.Errorf("warm sandbox: got %q, want %q", out, want)
	}
	res, err := sb.Run(ctx, "python3", "-c", "a = bytearray(200 << 20); print('survived')")
	if err != nil {
		t.Fatal(err)
	}
	if res.Code == 0 || strings.Contains(string(res.Stdout), "survived") {
		t.Errorf("200 MiB in a warm sandbox limited to 96 MiB: exit %d %q, want it killed", res.Code, res.Stdout)
	}
	res, err = sb.RunShell(ctx, "dd if=/dev/zero of=/tmp/fill bs=1M count=64")
	if err != nil {
		t.Fatal(err)
	}
	if res.Code == 0 || !strings.Contains(string(res.Stderr), "No space left") {
		t.Errorf("64 MiB into a 24 MiB warm sandbox: exit %d %q, want ENOSPC", res.Code, res.Stderr)
	}
	// A duplicate name is refused without wasting a warm box.
	if _, err := c.Create(ctx, sbx.CreateOptions{Name: "warm"}); !sbx.IsAlreadyExists(err) {
		t.Errorf("duplicate name via the pool: got %v, want AlreadyExists", err)
	}

	// Graceful stop destroys idle warm boxes; kill -9 leaves them for the next start to clean.
	d.waitPool(t, 2, sb.ID)
	d.stop()
	d.args = []string{"--warm-pool", "0"}
	d.start()
	d.assertNoLeaks(sb.ID)
	d.args = []string{"--warm-pool", "2"}
	d.stop()
	d.start()
	d.waitPool(t, 2, sb.ID)
	d.kill9()
	d.args = []string{"--warm-pool", "0"}
	d.start()
	d.assertNoLeaks(sb.ID)
	if got, err := c.Get(ctx, "warm"); err != nil || got.ID != sb.ID {
		t.Fatalf("warm sandbox after restarts: %v %v", got, err)
	}
	mustRun(t, ctx, sb, "true")
}
