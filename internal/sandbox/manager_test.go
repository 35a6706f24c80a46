package sandbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/fake"
	"github.com/sbxdev/sbx/internal/store"
	"github.com/sbxdev/sbx/internal/tenant"
	"github.com/sbxdev/sbx/internal/testutil"
)

type env struct {
	t     *testing.T
	dir   string
	store *store.Store
	drv   runtime.Driver
	mgr   *Manager
	// net is Config.Network (nil: networking off).
	net Network
}

// newEnv returns a manager over the fake driver (real agent processes, no
// isolation) and a real SQLite store in a temp dir.
func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, dir: t.TempDir()}
	e.open(nil)
	t.Cleanup(func() { e.close() })
	return e
}

func (e *env) open(wrap func(runtime.Driver) runtime.Driver) {
	t := e.t
	st, err := store.Open(context.Background(), e.dir)
	if err != nil {
		t.Fatal(err)
	}
	drv, err := fake.New(fake.Config{StateDir: e.dir + "/fake", AgentPath: testutil.AgentBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	var d runtime.Driver = drv
	if wrap != nil {
		d = wrap(drv)
	}
	mgr, err := New(Config{
		Store: st, Drivers: map[string]runtime.Driver{"fake": d}, DefaultRuntime: "fake",
		Defaults: runtime.Resources{MemoryBytes: 64 << 20, CPUMillis: 500, Pids: 64, DiskBytes: 16 << 20},
		Limits:   testLimits, TickInterval: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Network: e.net,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := mgr.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	mgr.Run()
	e.store, e.drv, e.mgr = st, d, mgr
}

// close stops the manager like a daemon exit: sandboxes keep running.
func (e *env) close() {
	if e.mgr == nil {
		return
	}
	// Whatever a test left running is destroyed here, whichever tenant it
	// is (the fake driver's agents are host processes: one left is a leak).
	e.mgr.mu.RLock()
	var left []*box
	for _, b := range e.mgr.boxes {
		left = append(left, b)
	}
	e.mgr.mu.RUnlock()
	for _, b := range left {
		ctx := tenant.WithPrincipal(context.Background(), tenant.Principal{Tenant: b.tenant})
		_ = e.mgr.Destroy(ctx, b.id)
	}
	e.mgr.Close()
	e.store.Close()
	e.mgr = nil
}

func (e *env) hello(ref string) error {
	conn, release, err := e.mgr.Agent(context.Background(), ref)
	if err != nil {
		return err
	}
	defer release()
	_, err = conn.Hello(context.Background())
	return err
}

func TestManagerLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{Name: "one", Labels: map[string]string{"a": "1"}, Secrets: map[string]string{"K": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != sbxv1.SandboxState_SANDBOX_STATE_RUNNING || sb.Image != "host" || sb.Resources.GetMemoryBytes() != 64<<20 {
		t.Errorf("created sandbox: got %v", sb)
	}
	if strings.Contains(sb.String(), `"v"`) || len(sb.SecretNames) != 1 {
		t.Errorf("secret handling: got %v", sb)
	}
	for _, ref := range []string{sb.Id, "one"} {
		if got, err := e.mgr.Get(ctx, ref); err != nil || got.Id != sb.Id {
			t.Errorf("Get(%q) = %v, %v", ref, got, err)
		}
	}
	if err := e.hello("one"); err != nil {
		t.Fatal(err)
	}
	list, _ := e.mgr.List(ctx, []string{"a=1"})
	if len(list) != 1 {
		t.Errorf("list a=1: got %d, want 1", len(list))
	}
	if _, err := e.mgr.Stop(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	if err := e.hello("one"); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "stopped") {
		t.Errorf("agent of a stopped sandbox: got %v, want FailedPrecondition", err)
	}
	if _, err := e.mgr.Start(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	if err := e.hello("one"); err != nil {
		t.Fatal(err)
	}
	if err := e.mgr.Destroy(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.mgr.Get(ctx, sb.Id); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "destroyed") {
		t.Errorf("Get after destroy: got %v, want NotFound saying it was destroyed", err)
	}
	if _, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{Name: "one"}); err != nil {
		t.Errorf("reusing the name of a destroyed sandbox: %v", err)
	}
	if err := e.mgr.WaitTeardowns(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Get(ctx, sb.Id); !errdefs.IsNotFound(err) {
		t.Errorf("record after destroy: got %v, want it deleted", err)
	}
}

// stuckDestroyDriver holds every Destroy until release is closed: a
// teardown that has not run yet when the daemon dies.
type stuckDestroyDriver struct {
	runtime.Driver
	entered chan string
	release chan struct{}
}

func (d *stuckDestroyDriver) Destroy(ctx context.Context, h runtime.Handle) error {
	select {
	case d.entered <- h.ID:
	default:
	}
	<-d.release
	return d.Driver.Destroy(ctx, h)
}

// A destroy answers before its box is torn down, the name is free at once,
// and a daemon that dies before the teardown ends does not bring the
// destroyed box back: the next start finishes the teardown.
func TestManagerDestroyAnswersBeforeTeardown(t *testing.T) {
	e := newEnv(t)
	e.mgr.Close()
	e.store.Close()
	stuck := &stuckDestroyDriver{entered: make(chan string, 1), release: make(chan struct{})}
	e.open(func(d runtime.Driver) runtime.Driver { stuck.Driver = d; return stuck })
	ctx := context.Background()
	old, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{Name: "web"})
	if err != nil {
		t.Fatal(err)
	}
	destroyed := make(chan error, 1)
	go func() { destroyed <- e.mgr.Destroy(ctx, "web") }()
	select {
	case err := <-destroyed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		close(stuck.release)
		t.Fatal("destroy did not answer while its box's teardown was held")
	}
	if id := <-stuck.entered; id != old.Id {
		t.Errorf("teardown of %s, want %s", id, old.Id)
	}
	if rec, err := e.store.Get(ctx, old.Id); err != nil || rec.State != "destroying" || rec.Name != "" {
		t.Errorf("record of the destroyed sandbox during teardown: got %+v, %v; want state destroying, no name", rec, err)
	}
	if list, _ := e.mgr.List(ctx, nil); len(list) != 0 {
		t.Errorf("listed during teardown: %v, want none", list)
	}
	reuse, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{Name: "web"})
	if err != nil {
		t.Fatalf("reusing the name while the old box is torn down: %v", err)
	}

	// The daemon dies with the teardown held: a new manager over the same
	// store and state takes over (the old one's teardown stays stuck).
	crashed, crashedStore := e.mgr, e.store
	e.open(nil)
	if got, err := e.mgr.Get(ctx, "web"); err != nil || got.Id != reuse.Id || got.State != sbxv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Errorf("\"web\" after restart: got %v %v, want %s running", got.GetId(), err, reuse.Id)
	}
	if _, err := e.mgr.Get(ctx, old.Id); !errdefs.IsNotFound(err) {
		t.Errorf("destroyed sandbox after restart: got %v, want NotFound", err)
	}
	if _, err := e.store.Get(ctx, old.Id); !errdefs.IsNotFound(err) {
		t.Errorf("record of the destroyed sandbox after restart: got %v, want it deleted", err)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "fake", old.Id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("box of the destroyed sandbox after restart: stat %v, want it removed", err)
	}
	close(stuck.release)
	crashed.Close()
	crashedStore.Close()
}

func TestManagerUniqueNameUnderConcurrency(t *testing.T) {
	e := newEnv(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, taken := 0, 0
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.mgr.Create(context.Background(), &sbxv1.CreateSandboxRequest{Name: "same"})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errdefs.IsAlreadyExists(err):
				taken++
			default:
				t.Errorf("create: %v", err)
			}
		}()
	}
	wg.Wait()
	if ok != 1 || taken != 5 {
		t.Errorf("got %d created and %d refused, want 1 and 5", ok, taken)
	}
}

func TestManagerBadInput(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, tc := range []struct {
		req  *sbxv1.CreateSandboxRequest
		want error
	}{
		{&sbxv1.CreateSandboxRequest{Image: "ubuntu:24.04"}, errdefs.ErrNotFound},
		{&sbxv1.CreateSandboxRequest{Runtime: "nope"}, errdefs.ErrInvalidArgument},
		{&sbxv1.CreateSandboxRequest{Resources: &sbxv1.Resources{MemoryBytes: 1}}, errdefs.ErrInvalidArgument},
	} {
		if _, err := e.mgr.Create(ctx, tc.req); !errors.Is(err, tc.want) {
			t.Errorf("Create(%v): got %v, want %v", tc.req, err, tc.want)
		}
	}
	for _, ref := range []string{"", "missing", "sb-000000000000"} {
		if _, err := e.mgr.Get(ctx, ref); err == nil {
			t.Errorf("Get(%q) succeeded", ref)
		}
		if err := e.mgr.Destroy(ctx, ref); err == nil {
			t.Errorf("Destroy(%q) succeeded", ref)
		}
	}
	if list, _ := e.mgr.List(ctx, nil); len(list) != 0 {
		t.Errorf("failed creates left %d sandboxes", len(list))
	}
}

// failingDriver fails Create after the inner driver made the box, to check
// the manager rolls back.
type failingDriver struct{ runtime.Driver }

func (f failingDriver) Create(ctx context.Context, spec runtime.Spec) (runtime.Handle, error) {
	h, err := f.Driver.Create(ctx, spec)
	if err != nil {
		return h, err
	}
	_ = f.Driver.Destroy(ctx, h)
	return h, errors.New("injected failure")
}

func TestManagerFailedCreateRollsBack(t *testing.T) {
	e := newEnv(t)
	e.mgr.Close()
	e.store.Close()
	e.open(func(d runtime.Driver) runtime.Driver { return failingDriver{d} })
	ctx := context.Background()
	if _, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{Name: "doomed"}); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("got %v, want the injected failure", err)
	}
	if recs, _ := e.store.List(ctx); len(recs) != 0 {
		t.Errorf("records after a failed create: %d", len(recs))
	}
	if list, _ := e.mgr.List(ctx, nil); len(list) != 0 {
		t.Errorf("sandboxes after a failed create: %d", len(list))
	}
}

func TestManagerTimeouts(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	life, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{TimeoutMs: 100})
	if err != nil {
		t.Fatal(err)
	}
	idle, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{IdleTimeoutMs: 100, IdleAction: sbxv1.IdleAction_IDLE_ACTION_STOP})
	if err != nil {
		t.Fatal(err)
	}
	// Activity in flight keeps a sandbox from idling.
	busy, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{IdleTimeoutMs: 100})
	if err != nil {
		t.Fatal(err)
	}
	_, release, err := e.mgr.Agent(ctx, busy.Id)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, errLife := e.mgr.Get(ctx, life.Id)
		gotIdle, _ := e.mgr.Get(ctx, idle.Id)
		if errdefs.IsNotFound(errLife) && gotIdle.GetState() == sbxv1.SandboxState_SANDBOX_STATE_STOPPED {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("timeouts did not fire: lifetime err %v, idle state %v", errLife, gotIdle.GetState())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got, err := e.mgr.Get(ctx, busy.Id); err != nil || got.State != sbxv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Errorf("busy sandbox idled out: %v %v", got.GetState(), err)
	}
	release()
	for {
		if _, err := e.mgr.Get(ctx, busy.Id); errdefs.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("busy sandbox was not destroyed once idle")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestManagerRecover(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	live, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{Name: "live"})
	if err != nil {
		t.Fatal(err)
	}
	stopped, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{Name: "stopped"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.mgr.Stop(ctx, "stopped"); err != nil {
		t.Fatal(err)
	}
	dead, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{Name: "dead"})
	if err != nil {
		t.Fatal(err)
	}
	// A record left "creating" by a crash mid-create.
	if err := e.store.Insert(ctx, &store.Record{ID: "sb-halfcreated", Name: "half", State: "creating", Spec: []byte(`{"runtime":"fake"}`), CreatedAtMs: 1}); err != nil {
		t.Fatal(err)
	}
	// The "dead" box dies while the daemon is down.
	e.mgr.Close()
	e.store.Close()
	b := e.mgr.boxes[dead.Id]
	if err := e.drv.Destroy(ctx, b.handle); err != nil {
		t.Fatal(err)
	}
	e.open(nil)

	if got, err := e.mgr.Get(ctx, "live"); err != nil || got.Id != live.Id || got.State != sbxv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Fatalf("live after restart: %v %v", got, err)
	}
	if err := e.hello("live"); err != nil {
		t.Errorf("agent of a re-attached sandbox: %v", err)
	}
	if got, err := e.mgr.Get(ctx, "stopped"); err != nil || got.Id != stopped.Id || got.State != sbxv1.SandboxState_SANDBOX_STATE_STOPPED {
		t.Errorf("stopped after restart: %v %v", got, err)
	}
	for _, ref := range []string{"dead", "half"} {
		if _, err := e.mgr.Get(ctx, ref); !errdefs.IsNotFound(err) {
			t.Errorf("%s after restart: got %v, want NotFound", ref, err)
		}
	}
	recs, _ := e.store.List(ctx)
	if len(recs) != 2 {
		t.Errorf("records after recovery: got %d, want 2", len(recs))
	}
}

// killStuckDriver is stuckDestroyDriver that can kill a box ahead of its
// teardown (runtime.Killer), counting the boxes it killed.
type killStuckDriver struct {
	*stuckDestroyDriver
	mu     sync.Mutex
	killed map[string]bool
}

func (d *killStuckDriver) Kill(_ context.Context, h runtime.Handle) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.killed[h.ID] = true
	return nil
}

// Destroys of boxes their driver killed first queue past teardownBacklog:
// with every teardown held, more destroys than the plain backlog (plus the
// workers) takes all answer, each box killed before its destroy answered;
// once the teardowns run, every record is gone.
func TestManagerKilledBoxesQueuePastBacklog(t *testing.T) {
	e := newEnv(t)
	e.mgr.Close()
	e.store.Close()
	stuck := &killStuckDriver{stuckDestroyDriver: &stuckDestroyDriver{entered: make(chan string, 1), release: make(chan struct{})},
		killed: map[string]bool{}}
	e.open(func(d runtime.Driver) runtime.Driver { stuck.Driver = d; return stuck })
	released := false
	defer func() {
		if !released {
			close(stuck.release)
		}
	}()
	ctx := context.Background()
	n := teardownBacklog + teardownConcurrency + 8
	var ids []string
	for range n {
		sb, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.Id)
	}
	for i, id := range ids {
		done := make(chan error, 1)
		go func() { done <- e.mgr.Destroy(ctx, id) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("destroy %d of %d did not answer while the teardowns were held (torn down inline: not queued)", i+1, n)
		}
		stuck.mu.Lock()
		k := stuck.killed[id]
		stuck.mu.Unlock()
		if !k {
			t.Errorf("destroy of %s answered before its box was killed", id)
		}
	}
	close(stuck.release)
	released = true
	if err := e.mgr.WaitTeardowns(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if _, err := e.store.Get(ctx, id); !errdefs.IsNotFound(err) {
			t.Errorf("record of %s after its teardown: %v, want it deleted", id, err)
		}
	}
}
