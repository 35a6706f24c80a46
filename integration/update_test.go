package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sbxdev/sbx/internal/tenant"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// boxCgroupInt reads a number from a box's v1 cgroup file of controller
// ctrl (e.g. "memory", "memory.limit_in_bytes"), failing the test if the
// file is not there (the host's layout is v1 for these; see MACHINE-NOTES).
func boxCgroupInt(t *testing.T, ctrl, id, file string) int64 {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", ctrl, "sbx*", id))
	if len(dirs) != 1 {
		t.Skipf("no v1 %s cgroup for %s (found %v): this test reads cgroup v1 files", ctrl, id, dirs)
	}
	b, err := os.ReadFile(filepath.Join(dirs[0], file))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitGone polls until sandbox id is gone, and returns why.
func waitGone(t *testing.T, c *sbx.Client, id string, by time.Time) error {
	t.Helper()
	for {
		_, err := c.Get(context.Background(), id)
		if sbx.IsNotFound(err) {
			return err
		}
		if time.Now().After(by) {
			t.Fatalf("sandbox %s still there at %s (err %v)", id, by.Format(time.RFC3339Nano), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestUpdateLifetime: `sbx update --timeout` moves a sandbox's deadline
// (counted from the update), the reaper honours the new one after the old
// has passed, a daemon restart keeps it, and a shorter one ends the box.
func TestUpdateLifetime(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	c := d.client()
	sb := newBox(t, ctx, d, sbx.CreateOptions{Timeout: 2 * time.Second})
	oldDeadline := time.UnixMilli(sb.Info.GetExpiresAtMs())
	before := time.Now()
	out, errOut, code := d.cli("", "update", sb.ID, "--timeout", "8s")
	if code != 0 {
		t.Fatalf("sbx update --timeout 8s: exit %d, %s", code, errOut)
	}
	if !strings.HasPrefix(out, sb.ID+"\t") {
		t.Errorf("sbx update printed %q, want a line starting with the id", out)
	}
	if err := sb.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	newDeadline := time.UnixMilli(sb.Info.GetExpiresAtMs())
	if newDeadline.Before(before.Add(8*time.Second)) || sb.Info.GetTimeoutMs() != 8000 {
		t.Fatalf("after update: expires %s, timeout %dms; want at or after %s and 8000", newDeadline, sb.Info.GetTimeoutMs(), before.Add(8*time.Second))
	}
	// The stored deadline survives a daemon crash.
	d.kill9()
	d.start()
	if err := sb.Refresh(ctx); err != nil || !time.UnixMilli(sb.Info.GetExpiresAtMs()).Equal(newDeadline) {
		t.Fatalf("after restart: expires %v (%v), want %s", time.UnixMilli(sb.Info.GetExpiresAtMs()), err, newDeadline)
	}
	// Alive and working past the old deadline, until shortly before the new.
	for time.Until(newDeadline) > time.Second {
		if err := sb.Refresh(ctx); err != nil {
			t.Fatalf("at %s (old deadline %s, new %s): %v", time.Now().Format(time.RFC3339Nano), oldDeadline, newDeadline, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if time.Now().Before(oldDeadline.Add(time.Second)) {
		t.Fatalf("the check ended before the old deadline had passed")
	}
	execWorks(t, sb, "past the old deadline")
	// Then the new deadline ends it.
	err := waitGone(t, c, sb.ID, newDeadline.Add(10*time.Second))
	if !strings.Contains(err.Error(), "lifetime timeout") {
		t.Errorf("gone with %v, want the lifetime timeout named", err)
	}

	// Shortening: a 10-minute box told 1 s goes within seconds.
	long := newBox(t, ctx, d, sbx.CreateOptions{Timeout: 10 * time.Minute})
	if err := long.SetTimeout(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	err = waitGone(t, c, long.ID, time.Now().Add(15*time.Second))
	if !strings.Contains(err.Error(), "lifetime timeout") {
		t.Errorf("shortened box gone with %v, want the lifetime timeout named", err)
	}
}

// TestUpdateLabelsAndLimits: labels set and removed by `sbx update` are what
// `sbx ls -l` selects on; new limits reach the box's cgroups on the host and
// take effect inside (a 150 MB allocation OOM-killed under 128 MiB works
// under 256 MiB); limits that do not fit the host are refused naming them.
func TestUpdateLabelsAndLimits(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	sb := newBox(t, ctx, d, sbx.CreateOptions{Labels: map[string]string{"tier": "x"}, MemoryBytes: 128 << 20, CPUs: 0.5, Pids: 128})
	if _, errOut, code := d.cli("", "update", sb.ID, "--label", "team=b", "--label-rm", "tier"); code != 0 {
		t.Fatalf("sbx update --label: exit %d, %s", code, errOut)
	}
	if out, _, _ := d.cli("", "ls", "-l", "team=b"); !strings.Contains(out, sb.ID) {
		t.Errorf("sbx ls -l team=b:\n%s\nwant %s listed", out, sb.ID)
	}
	if out, _, _ := d.cli("", "ls", "-l", "tier"); strings.Contains(out, sb.ID) {
		t.Errorf("sbx ls -l tier:\n%s\nwant %s not listed (label removed)", out, sb.ID)
	}

	hog := "python3 -c 'b = bytearray(150 << 20); b[::4096] = b\"x\" * len(b[::4096]); print(len(b))'"
	res, err := sb.RunShell(ctx, hog)
	if err != nil || res.Code != 137 || !res.OOMKilled {
		t.Fatalf("150 MB under 128 MiB: %+v %v, want OOM-killed", res, err)
	}
	if _, errOut, code := d.cli("", "update", sb.ID, "--memory", "256M", "--cpus", "1", "--pids", "300"); code != 0 {
		t.Fatalf("sbx update --memory: exit %d, %s", code, errOut)
	}
	for _, c := range []struct {
		ctrl, file string
		want       int64
	}{
		{"memory", "memory.limit_in_bytes", 256 << 20},
		{"cpu", "cpu.cfs_quota_us", 100000},
		{"pids", "pids.max", 300},
	} {
		if got := boxCgroupInt(t, c.ctrl, sb.ID, c.file); got != c.want {
			t.Errorf("host %s after update: got %d, want %d", c.file, got, c.want)
		}
	}
	res, err = sb.RunShell(ctx, hog)
	if err != nil || res.Code != 0 || res.OOMKilled {
		t.Errorf("150 MB under 256 MiB: %+v %v, want success", res, err)
	}
	_, errOut, code := d.cli("", "update", sb.ID, "--memory", "1T")
	if code == 0 || !strings.Contains(errOut, "above this host's maximum") {
		t.Errorf("sbx update --memory 1T: exit %d, stderr %q; want refused naming the host's maximum", code, errOut)
	}
	if got := boxCgroupInt(t, "memory", sb.ID, "memory.limit_in_bytes"); got != 256<<20 {
		t.Errorf("host memory limit after a refused update: got %d, want %d", got, 256<<20)
	}
}

// TestUpdateTenantQuota: a tenant cannot raise its sandboxes' limits past
// its memory quota by updating; the refusal names the quota and leaves the
// box's cgroup as it was. Another tenant's update of the box is NotFound.
func TestUpdateTenantQuota(t *testing.T) {
	dir := t.TempDir()
	tokA, tokB := tenant.NewToken(), tenant.NewToken()
	tenants := filepath.Join(dir, "tenants.json")
	if err := os.WriteFile(tenants, fmt.Appendf(nil, `{"tenants": [
		{"name": "acme", "tokens": [%q], "quotas": {"memory_bytes": %d}},
		{"name": "beta", "tokens": [%q]}]}`, tenant.HashToken(tokA), 512<<20, tenant.HashToken(tokB)), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemonOpts(t, daemonOpts{token: tokA}, "--tenants", tenants)
	ctx := ctxT(t, time.Minute)
	sb := newBox(t, ctx, d, sbx.CreateOptions{MemoryBytes: 256 << 20})
	_ = newBox(t, ctx, d, sbx.CreateOptions{MemoryBytes: 128 << 20})
	err := sb.Update(ctx, sbx.UpdateOptions{MemoryBytes: 512 << 20})
	var se *sbx.Error
	if !errors.As(err, &se) || se.Code != connect.CodeResourceExhausted || !strings.Contains(se.Msg, "quota memory_bytes") {
		t.Errorf("update past acme's memory quota: got %v, want ResourceExhausted naming memory_bytes", err)
	}
	if got := boxCgroupInt(t, "memory", sb.ID, "memory.limit_in_bytes"); got != 256<<20 {
		t.Errorf("host memory limit after the refusal: got %d, want %d", got, 256<<20)
	}
	// What the quota leaves (128 MiB) may be taken.
	if err := sb.Update(ctx, sbx.UpdateOptions{MemoryBytes: 384 << 20}); err != nil {
		t.Errorf("update within the quota: %v", err)
	}
	b := sbx.NewClient(d.url(), sbx.WithToken(tokB))
	defer b.Close()
	other, err := b.Get(ctx, sb.ID)
	if err == nil {
		t.Fatalf("beta got acme's sandbox %s", other.ID)
	}
	asBeta := *d
	asBeta.token = tokB
	if _, errOut, code := asBeta.cli("", "update", sb.ID, "--timeout", "1s"); code == 0 || !strings.Contains(errOut, "not found") {
		t.Errorf("beta's sbx update of acme's box: exit %d, stderr %q; want not found", code, errOut)
	}
	if err := sb.Refresh(ctx); err != nil || sb.Info.GetTimeoutMs() == 1000 {
		t.Errorf("acme's box after beta's update: %v, timeout %d", err, sb.Info.GetTimeoutMs())
	}
}

// TestAutoResume: a sandbox created with --auto-resume and stopped is
// started by an exec (and by a file read); one without it refuses.
func TestAutoResume(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, time.Minute)
	out, errOut, code := d.cli("", "create", "--auto-resume")
	if code != 0 {
		t.Fatalf("sbx create --auto-resume: exit %d, %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	d.remember(id)
	auto, err := d.client().Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = auto.Destroy(context.Background()) })
	plain := newBox(t, ctx, d, sbx.CreateOptions{})
	for _, sb := range []*sbx.Sandbox{auto, plain} {
		if err := sb.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, errOut, code := d.cli("", "exec", plain.ID, "--", "true"); code == 0 || !strings.Contains(errOut, "is stopped") {
		t.Errorf("exec in a stopped sandbox: exit %d, stderr %q; want refused", code, errOut)
	}
	out, errOut, code = d.cli("", "exec", id, "--", "echo", "back")
	if code != 0 || out != "back\n" {
		t.Fatalf("exec in a stopped auto-resume sandbox: exit %d, out %q, stderr %q", code, out, errOut)
	}
	if err := auto.Refresh(ctx); err != nil || auto.Info.GetState().String() != "SANDBOX_STATE_RUNNING" || !auto.Info.GetAutoResume() {
		t.Errorf("after the exec: %v %v auto_resume %v, want running", auto.Info.GetState(), err, auto.Info.GetAutoResume())
	}
	// Files resume it too.
	if err := auto.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := auto.ReadFile(ctx, "/etc/hostname"); err != nil {
		t.Errorf("read a file of a stopped auto-resume sandbox: %v", err)
	}
	// And it can be switched on for the other.
	if _, errOut, code := d.cli("", "update", plain.ID, "--auto-resume"); code != 0 {
		t.Fatalf("sbx update --auto-resume: exit %d, %s", code, errOut)
	}
	execWorks(t, plain, "after turning auto-resume on")
}
