package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbxdev/sbx/internal/crashpoint"
)

// A graceful stop that lands inside a warm-pool refill leaves nothing
// running (seen once: a warm box left running with its mounts after
// SIGTERM). The stop is landed for sure, at each pause point a refill goes
// through: inside the runtime's create (the box's processes run, its agent
// not yet awaited) and after it (the box runs, not yet checked nor in the
// pool). The daemon must exit on SIGTERM well before the harness's
// SIGKILL, and leave no box dir, mount, cgroup, process, network slot,
// netns or veth.
func TestWarmPoolStopInsideRefill(t *testing.T) {
	d, net := startCrashDaemon(t)
	pointDir := t.TempDir()
	for _, point := range crashpoint.PausePoints {
		t.Run(point, func(t *testing.T) {
			d.stop()
			clearDir(t, pointDir)
			d.args = append(d.args, "--warm-pool", "1")
			d.env = []string{"SBX_CRASHPOINT_DIR=" + pointDir, "SBX_PAUSEPOINTS=" + point}
			d.start()
			var id string
			for deadline := time.Now().Add(time.Minute); id == "" && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				b, _ := os.ReadFile(filepath.Join(pointDir, point))
				if s := strings.TrimSpace(string(b)); strings.HasSuffix(string(b), "\n") {
					id = s
				}
			}
			if id == "" {
				t.Fatalf("no refill reached pause point %s within a minute", point)
			}
			// The box is there, mid-refill, as the stop lands.
			if _, err := os.Stat(filepath.Join(d.dataDir, "oci", "boxes", id)); err != nil {
				t.Fatalf("box %s paused at %s: %v", id, point, err)
			}
			t0 := time.Now()
			d.stop()
			if took := time.Since(t0); took > 10*time.Second {
				t.Errorf("graceful stop with a refill paused at %s took %v, want it to cancel the refill (the harness SIGKILLs at 15 s)", point, took)
			}
			if l := waitNoCrashLeaks(d, net, nil, true); len(l) > 0 {
				t.Errorf("after a graceful stop inside a refill (%s, box %s), left:\n%s", point, id, strings.Join(l, "\n"))
			}
			d.env = nil
			d.start() // for the next point, and the cleanup
		})
	}
}
