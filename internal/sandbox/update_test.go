package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/tenant"
)

// updatingDriver is the fake driver with limits that change (CapUpdate):
// it records what Update was given and fails when fail is set.
type updatingDriver struct {
	runtime.Driver
	mu   sync.Mutex
	got  []runtime.Resources
	fail error
}

func (d *updatingDriver) Info(ctx context.Context) runtime.Info {
	info := d.Driver.Info(ctx)
	info.Capabilities = append(append([]runtime.Capability(nil), info.Capabilities...), runtime.CapUpdate)
	return info
}

func (d *updatingDriver) Update(_ context.Context, _ runtime.Handle, r runtime.Resources) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail != nil {
		return d.fail
	}
	d.got = append(d.got, r)
	return nil
}

// restart stops the manager as a daemon exit does (boxes keep running)
// and starts a new one over the same store and boxes.
func (e *env) restart(wrap func(runtime.Driver) runtime.Driver) {
	e.mgr.Close()
	e.store.Close()
	e.open(wrap)
}

func i64(v int64) *int64 { return &v }

func TestUpdateLabelsAndPersist(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{Labels: map[string]string{"team": "a", "tier": "x"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		req  *sbxv1.UpdateSandboxRequest
		want map[string]string
	}{
		{"set and remove", &sbxv1.UpdateSandboxRequest{SetLabels: map[string]string{"team": "b", "new": "1"}, RemoveLabels: []string{"tier"}},
			map[string]string{"team": "b", "new": "1"}},
		{"remove missing", &sbxv1.UpdateSandboxRequest{RemoveLabels: []string{"absent"}}, map[string]string{"team": "b", "new": "1"}},
		{"nothing", &sbxv1.UpdateSandboxRequest{}, map[string]string{"team": "b", "new": "1"}},
		{"replace", &sbxv1.UpdateSandboxRequest{ReplaceLabels: true, SetLabels: map[string]string{"only": "this"}}, map[string]string{"only": "this"}},
	} {
		tc.req.Sandbox = sb.Id
		got, err := e.mgr.Update(ctx, tc.req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if diff := cmp.Diff(tc.want, got.Labels); diff != "" {
			t.Errorf("%s: labels (-want +got):\n%s", tc.name, diff)
		}
	}
	list, err := e.mgr.List(ctx, []string{"only=this"})
	if err != nil || len(list) != 1 || list[0].Id != sb.Id {
		t.Fatalf("List(only=this) = %v, %v; want the updated sandbox", list, err)
	}
	if list, _ := e.mgr.List(ctx, []string{"team"}); len(list) != 0 {
		t.Errorf("List(team) found %d sandboxes, want 0 (label removed)", len(list))
	}
	// A restarted daemon sees the new labels and deadline.
	upd, err := e.mgr.Update(ctx, &sbxv1.UpdateSandboxRequest{Sandbox: sb.Id, TimeoutMs: i64(600_000)})
	if err != nil {
		t.Fatal(err)
	}
	e.restart(nil)
	got, err := e.mgr.Get(ctx, sb.Id)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"only": "this"}, got.Labels); diff != "" {
		t.Errorf("labels after restart (-want +got):\n%s", diff)
	}
	if got.ExpiresAtMs != upd.ExpiresAtMs || got.TimeoutMs != 600_000 {
		t.Errorf("after restart: expires %d timeout %d, want %d and 600000", got.ExpiresAtMs, got.TimeoutMs, upd.ExpiresAtMs)
	}
}

// A lifetime update moves the deadline the reaper honours, both ways.
func TestUpdateLifetime(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{TimeoutMs: 300})
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now().UnixMilli()
	got, err := e.mgr.Update(ctx, &sbxv1.UpdateSandboxRequest{Sandbox: sb.Id, TimeoutMs: i64(60_000)})
	if err != nil {
		t.Fatal(err)
	}
	if got.ExpiresAtMs < before+60_000 || got.TimeoutMs != 60_000 {
		t.Fatalf("expires_at %d timeout %d, want >= %d and 60000", got.ExpiresAtMs, got.TimeoutMs, before+60_000)
	}
	// Past the old deadline, a reaper pass (besides the ticker's) keeps it.
	for time.Now().UnixMilli() <= sb.ExpiresAtMs {
		time.Sleep(time.Duration(sb.ExpiresAtMs-time.Now().UnixMilli()+1) * time.Millisecond)
	}
	e.mgr.enforceTimeouts()
	// A reaper that looked before the update destroys only after looking
	// again under the box's opMu.
	e.mgr.mu.RLock()
	b := e.mgr.boxes[sb.Id]
	e.mgr.mu.RUnlock()
	if err := e.mgr.destroyExpired(ctx, b); err != nil {
		t.Fatal(err)
	}
	if _, err := e.mgr.Get(ctx, sb.Id); err != nil {
		t.Fatalf("extended sandbox after its old deadline: %v", err)
	}
	// Shortened, it goes.
	if _, err := e.mgr.Update(ctx, &sbxv1.UpdateSandboxRequest{Sandbox: sb.Id, TimeoutMs: i64(1)}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := e.mgr.Get(ctx, sb.Id)
		if errdefs.IsNotFound(err) {
			if !strings.Contains(err.Error(), "lifetime timeout") {
				t.Errorf("gone with %v, want the lifetime timeout named", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("shortened sandbox was not destroyed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestUpdateRefusals(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{Labels: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		req  *sbxv1.UpdateSandboxRequest
		is   func(error) bool
		want string
	}{
		{"negative timeout", &sbxv1.UpdateSandboxRequest{TimeoutMs: i64(-1)}, errdefs.IsInvalidArgument, "timeout -1ms"},
		{"beyond max life", &sbxv1.UpdateSandboxRequest{TimeoutMs: i64(3600_001)}, errdefs.IsInvalidArgument, "bounds its life to 1h0m0s"},
		{"no limit under a max", &sbxv1.UpdateSandboxRequest{TimeoutMs: i64(0)}, errdefs.IsInvalidArgument, "timeout 0"},
		{"negative idle", &sbxv1.UpdateSandboxRequest{IdleTimeoutMs: i64(-5)}, errdefs.IsInvalidArgument, "idle timeout -5ms"},
		{"bad label key", &sbxv1.UpdateSandboxRequest{SetLabels: map[string]string{"-x": "v"}}, errdefs.IsInvalidArgument, `label key "-x"`},
		{"bad remove key", &sbxv1.UpdateSandboxRequest{RemoveLabels: []string{"a b"}}, errdefs.IsInvalidArgument, `label key "a b" to remove`},
		{"set and remove", &sbxv1.UpdateSandboxRequest{SetLabels: map[string]string{"k": "w"}, RemoveLabels: []string{"k"}}, errdefs.IsInvalidArgument, `"k": both set and removed`},
		{"replace and remove", &sbxv1.UpdateSandboxRequest{ReplaceLabels: true, RemoveLabels: []string{"k"}}, errdefs.IsInvalidArgument, "remove_labels"},
		{"disk", &sbxv1.UpdateSandboxRequest{Resources: &sbxv1.Resources{DiskBytes: 1 << 30}}, errdefs.IsInvalidArgument, "disk 1GiB"},
		{"memory above host", &sbxv1.UpdateSandboxRequest{Resources: &sbxv1.Resources{MemoryBytes: 16 << 30}}, errdefs.IsInvalidArgument, "above this host's maximum"},
		{"pids below min", &sbxv1.UpdateSandboxRequest{Resources: &sbxv1.Resources{Pids: 2}}, errdefs.IsInvalidArgument, "below the minimum"},
		// The fake runtime cannot change limits: refused naming it.
		{"no update capability", &sbxv1.UpdateSandboxRequest{Resources: &sbxv1.Resources{MemoryBytes: 128 << 20}}, errdefs.IsFailedPrecondition, `runtime "fake" does not support changing a sandbox's limits (it lacks the "update" capability)`},
		{"missing sandbox", &sbxv1.UpdateSandboxRequest{Sandbox: "sb-0000000000ff"}, errdefs.IsNotFound, "sb-0000000000ff"},
	} {
		if tc.req.Sandbox == "" {
			tc.req.Sandbox = sb.Id
		}
		_, err := e.mgr.Update(ctx, tc.req)
		if !tc.is(err) || !strings.Contains(fmtErr(err), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q of the right kind", tc.name, err, tc.want)
		}
	}
	got, err := e.mgr.Get(ctx, sb.Id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Labels["k"] != "v" || got.Resources.MemoryBytes != 64<<20 || got.ExpiresAtMs != sb.ExpiresAtMs {
		t.Errorf("refused updates changed the sandbox: labels %v memory %d expires %d", got.Labels, got.Resources.MemoryBytes, got.ExpiresAtMs)
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// Limits reach the driver, count against the tenant's quotas, and a failed
// driver update leaves the old limits in place.
func TestUpdateLimitsAndQuota(t *testing.T) {
	e := &env{t: t, dir: t.TempDir()}
	var drv *updatingDriver
	e.open(func(d runtime.Driver) runtime.Driver { drv = &updatingDriver{Driver: d}; return drv })
	t.Cleanup(e.close)
	ctx := tenant.WithPrincipal(context.Background(), tenant.Principal{Tenant: "acme", Quotas: tenant.Quotas{MemoryBytes: 256 << 20, CPUMillis: 1500}})
	a, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{Resources: &sbxv1.Resources{MemoryBytes: 64 << 20, CpuMillis: 500}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{Resources: &sbxv1.Resources{MemoryBytes: 64 << 20, CpuMillis: 500}})
	if err != nil {
		t.Fatal(err)
	}
	// 64 MiB of acme's 256 are b's: a may grow to 192 MiB, not more.
	_, err = e.mgr.Update(ctx, &sbxv1.UpdateSandboxRequest{Sandbox: a.Id, Resources: &sbxv1.Resources{MemoryBytes: 200 << 20}})
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "quota memory_bytes") {
		t.Fatalf("memory over quota: got %v, want ResourceExhausted naming memory_bytes", err)
	}
	_, err = e.mgr.Update(ctx, &sbxv1.UpdateSandboxRequest{Sandbox: a.Id, Resources: &sbxv1.Resources{CpuMillis: 1100}})
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "quota cpu_millis") {
		t.Fatalf("cpu over quota: got %v, want ResourceExhausted naming cpu_millis", err)
	}
	got, err := e.mgr.Update(ctx, &sbxv1.UpdateSandboxRequest{Sandbox: a.Id, Resources: &sbxv1.Resources{MemoryBytes: 192 << 20, CpuMillis: 1000, Pids: 100}})
	if err != nil {
		t.Fatal(err)
	}
	want := runtime.Resources{MemoryBytes: 192 << 20, CPUMillis: 1000, Pids: 100}
	if r := got.Resources; r.MemoryBytes != want.MemoryBytes || r.CpuMillis != want.CPUMillis || r.Pids != want.Pids {
		t.Errorf("resources = %v, want %+v", r, want)
	}
	if len(drv.got) != 1 || drv.got[0] != want {
		t.Errorf("driver updates = %+v, want [%+v]", drv.got, want)
	}
	// acme is now full: b cannot grow, and a create is refused too.
	if _, err := e.mgr.Update(ctx, &sbxv1.UpdateSandboxRequest{Sandbox: b.Id, Resources: &sbxv1.Resources{MemoryBytes: 65 << 20}}); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("growing b with acme full: got %v, want ResourceExhausted", err)
	}
	if _, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{Resources: &sbxv1.Resources{MemoryBytes: 16 << 20}}); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("create with acme full: got %v, want ResourceExhausted", err)
	}
	// Lowering is always allowed; a driver failure keeps the old limits.
	drv.fail = errdefs.ErrFailedPrecondition
	if _, err := e.mgr.Update(ctx, &sbxv1.UpdateSandboxRequest{Sandbox: a.Id, Resources: &sbxv1.Resources{MemoryBytes: 32 << 20}}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("failing driver: got %v, want its error", err)
	}
	if u := e.mgr.Usage(ctx); u.MemoryBytes != 256<<20 {
		t.Errorf("usage after a failed update = %d, want %d (the old limits)", u.MemoryBytes, 256<<20)
	}
	drv.fail = nil
	if _, err := e.mgr.Update(ctx, &sbxv1.UpdateSandboxRequest{Sandbox: a.Id, Resources: &sbxv1.Resources{MemoryBytes: 32 << 20}}); err != nil {
		t.Fatal(err)
	}
	// Persisted: a restarted daemon counts the new limits.
	e.restart(func(d runtime.Driver) runtime.Driver { return &updatingDriver{Driver: d} })
	if u := e.mgr.Usage(ctx); u.MemoryBytes != 96<<20 || u.CPUMillis != 1500 {
		t.Errorf("usage after restart = %+v, want 96 MiB and 1500 millicpus", u)
	}
}

// A sandbox made with auto_resume is started by its next use; others are
// refused while stopped.
func TestAutoResume(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	auto, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{AutoResume: true})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{auto.Id, plain.Id} {
		if _, err := e.mgr.Stop(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := e.mgr.Agent(ctx, plain.Id); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "auto_resume") {
		t.Errorf("using a stopped sandbox: got %v, want FailedPrecondition mentioning auto_resume", err)
	}
	if err := e.hello(auto.Id); err != nil {
		t.Fatalf("using a stopped auto-resume sandbox: %v", err)
	}
	if got, _ := e.mgr.Get(ctx, auto.Id); got.GetState() != sbxv1.SandboxState_SANDBOX_STATE_RUNNING || !got.AutoResume {
		t.Errorf("after use: state %v auto_resume %v, want running and true", got.GetState(), got.GetAutoResume())
	}
	// auto_resume can be switched on later.
	if _, err := e.mgr.Update(ctx, &sbxv1.UpdateSandboxRequest{Sandbox: plain.Id, AutoResume: new(true)}); err != nil {
		t.Fatal(err)
	}
	if err := e.hello(plain.Id); err != nil {
		t.Fatalf("using a stopped sandbox after turning auto_resume on: %v", err)
	}
}

// An idle timeout set by an update is honoured, and its STOP action with
// auto_resume makes a box that sleeps when idle and wakes on use.
func TestUpdateIdle(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.mgr.Update(ctx, &sbxv1.UpdateSandboxRequest{Sandbox: sb.Id, IdleTimeoutMs: i64(50),
		IdleAction: sbxv1.IdleAction_IDLE_ACTION_STOP, AutoResume: new(true)})
	if err != nil {
		t.Fatal(err)
	}
	if got.IdleTimeoutMs != 50 || got.IdleAction != sbxv1.IdleAction_IDLE_ACTION_STOP || !got.AutoResume {
		t.Fatalf("after update: idle %d action %v auto_resume %v", got.IdleTimeoutMs, got.IdleAction, got.AutoResume)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := e.mgr.Get(ctx, sb.Id)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == sbxv1.SandboxState_SANDBOX_STATE_STOPPED {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not stopped after the idle timeout: %v", got.State)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := e.hello(sb.Id); err != nil {
		t.Fatalf("use after the idle stop: %v", err)
	}
}
