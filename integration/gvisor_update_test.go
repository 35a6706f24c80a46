package integration

import (
	"strings"
	"testing"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestGvisorUpdateLimits: `sbx update` changes a gvisor sandbox's memory,
// CPU and pids limits in place: the host cgroup runsc's sandbox runs in
// reads back the new values (pids plus runsc's allowance of 256 for its
// own threads), and a 150 MB allocation the old 128 MiB limit would not
// have held succeeds under the new one. A limit above the host's maximum is
// refused and changes nothing.
func TestGvisorUpdateLimits(t *testing.T) {
	runsc := runscForTests(t)
	d := startDaemon(t, "--runsc", runsc)
	ctx := ctxT(t, 2*time.Minute)
	sb := newBox(t, ctx, d, sbx.CreateOptions{Runtime: "gvisor", MemoryBytes: 128 << 20, CPUs: 0.5, Pids: 128})
	if got := boxCgroupInt(t, "memory", sb.ID, "memory.limit_in_bytes"); got != 128<<20 {
		t.Fatalf("host memory limit at create: got %d, want %d", got, 128<<20)
	}
	if _, errOut, code := d.cli("", "update", sb.ID, "--memory", "256M", "--cpus", "1", "--pids", "300"); code != 0 {
		t.Fatalf("sbx update --memory of a gvisor sandbox: exit %d, %s", code, errOut)
	}
	for _, c := range []struct {
		ctrl, file string
		want       int64
	}{
		{"memory", "memory.limit_in_bytes", 256 << 20},
		{"cpu", "cpu.cfs_quota_us", 100000},
		{"pids", "pids.max", 300 + 256},
	} {
		if got := boxCgroupInt(t, c.ctrl, sb.ID, c.file); got != c.want {
			t.Errorf("host %s after update: got %d, want %d", c.file, got, c.want)
		}
	}
	hog := "python3 -c 'b = bytearray(150 << 20); b[::4096] = b\"x\" * len(b[::4096]); print(len(b))'"
	if res, err := sb.RunShell(ctx, hog); err != nil || res.Code != 0 {
		t.Errorf("150 MB under 256 MiB on gvisor: %+v %v, want success", res, err)
	}
	_, errOut, code := d.cli("", "update", sb.ID, "--memory", "1T")
	if code == 0 || !strings.Contains(errOut, "above this host's maximum") {
		t.Errorf("sbx update --memory 1T: exit %d, stderr %q; want refused naming the host's maximum", code, errOut)
	}
	if got := boxCgroupInt(t, "memory", sb.ID, "memory.limit_in_bytes"); got != 256<<20 {
		t.Errorf("host memory limit after a refused update: got %d, want %d", got, 256<<20)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	d.assertNoLeaks()
}
