package sandbox

import (
	"context"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/fake"
	"github.com/sbxdev/sbx/internal/store"
	"github.com/sbxdev/sbx/internal/testutil"
)

// gatedDriver lets a test hold the warm pool's creates: each Create
// reports on entered, then waits for gate (if set) before creating the box.
type gatedDriver struct {
	runtime.Driver
	entered chan string
	gate    func(ctx context.Context)
}

func (d *gatedDriver) Create(ctx context.Context, spec runtime.Spec) (runtime.Handle, error) {
	if d.entered != nil {
		d.entered <- spec.ID
	}
	if d.gate != nil {
		d.gate(ctx)
	}
	// The box is made whatever became of ctx: a create the runtime
	// finished just as the daemon stopped.
	return d.Driver.Create(context.WithoutCancel(ctx), spec)
}

// poolEnv starts a manager with a warm pool of floor..ceiling over the fake
// driver wrapped in gd; it returns the manager and the fake driver's state
// dir (one entry per live box).
func poolEnv(t *testing.T, floor, ceiling int, gd *gatedDriver) (*Manager, string) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	drv, err := fake.New(fake.Config{StateDir: dir + "/fake", AgentPath: testutil.AgentBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	gd.Driver = drv
	m, err := New(Config{
		Store: st, Drivers: map[string]runtime.Driver{"fake": gd}, DefaultRuntime: "fake",
		Defaults: runtime.Resources{MemoryBytes: 64 << 20, CPUMillis: 500, Pids: 64, DiskBytes: 16 << 20},
		Limits:   testLimits, TickInterval: 10 * time.Millisecond, WarmPool: floor, WarmPoolMax: ceiling,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	m.Run()
	return m, dir + "/fake"
}

// liveBoxes counts the fake driver's boxes.
func liveBoxes(t *testing.T, stateDir string) int {
	t.Helper()
	ents, err := os.ReadDir(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// waitFor polls cond until it holds (10 s at most).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// closeWithin closes m and fails if that takes longer than limit.
func closeWithin(t *testing.T, m *Manager, limit time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { m.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
		t.Errorf("Close still running after %v with a refill in flight, want it to cancel the refill", limit)
		<-done
	}
}

// A graceful stop while a refill is in flight must not wait for the refill
// (the integration harness SIGKILLs a daemon whose stop takes 15 s, which
// left a warm box running with its mounts) and must leave no box behind,
// even when the runtime finishes creating the box after the stop began.
func TestWarmPoolStopRacingRefill(t *testing.T) {
	for _, tc := range []struct {
		name string
		// gate holds the refill's Create; release lets it go on.
		gate func(release <-chan struct{}) func(ctx context.Context)
	}{
		{"create finishes when cancelled", func(<-chan struct{}) func(context.Context) {
			return func(ctx context.Context) { <-ctx.Done() }
		}},
		{"create finishes after stop began", func(release <-chan struct{}) func(context.Context) {
			return func(context.Context) { <-release }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			gd := &gatedDriver{entered: make(chan string, 1), gate: tc.gate(release)}
			m, state := poolEnv(t, 1, 1, gd)
			<-gd.entered // a refill is in flight
			done := make(chan struct{})
			go func() { closeWithin(t, m, runtime.ProbeTimeout); close(done) }()
			// Let the held create finish once the stop has begun.
			waitFor(t, "the stop to begin", func() bool {
				select {
				case <-m.stop:
					return true
				default:
					return false
				}
			})
			close(release)
			<-done
			if n := liveBoxes(t, state); n != 0 {
				t.Errorf("after Close: %d boxes left, want 0", n)
			}
		})
	}
}

// poolState returns the pool's idle box ids and target.
func poolState(m *Manager) (idle []string, target int) {
	p := m.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.idle {
		idle = append(idle, w.id)
	}
	return idle, p.target
}

// The pool grows to serve a burst of concurrent creates warm, and shrinks
// back to its floor when demand stops, destroying what it no longer needs.
func TestWarmPoolAdapts(t *testing.T) {
	const burst = 4
	m, state := poolEnv(t, 1, burst, &gatedDriver{})
	t.Cleanup(m.Close)
	ctx := context.Background()
	createBurst := func() []string {
		var mu sync.Mutex
		var ids []string
		var wg sync.WaitGroup
		for range burst {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sb, err := m.Create(ctx, &sbxv1.CreateSandboxRequest{})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				ids = append(ids, sb.Id)
				mu.Unlock()
			}()
		}
		wg.Wait()
		return ids
	}
	waitFor(t, "the pool to hold its floor", func() bool { idle, _ := poolState(m); return len(idle) == 1 })
	first := createBurst()
	if _, target := poolState(m); target != burst {
		t.Errorf("after a burst of %d creates the pool's target is %d, want %d", burst, target, burst)
	}
	waitFor(t, "the pool to grow to the burst", func() bool { idle, _ := poolState(m); return len(idle) == burst })
	ready, _ := poolState(m)
	second := createBurst()
	for _, id := range second {
		if !slices.Contains(ready, id) {
			t.Errorf("sandbox %s of the second burst was created cold, want every one taken from the pool %v", id, ready)
		}
	}
	for _, id := range append(first, second...) {
		if err := m.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.WaitTeardowns(ctx); err != nil {
		t.Fatal(err)
	}
	// No demand from here on: the pool halves its target until the floor.
	waitFor(t, "the pool to refill", func() bool { idle, _ := poolState(m); return len(idle) == burst })
	m.pool.mu.Lock()
	m.pool.shrinkAfter = time.Millisecond
	m.pool.mu.Unlock()
	waitFor(t, "the pool to shrink to its floor", func() bool {
		m.pool.wakeUp()
		idle, target := poolState(m)
		return len(idle) == 1 && target == 1
	})
	// The boxes the pool let go are destroyed after they leave it.
	waitFor(t, "the excess warm boxes to be destroyed (1 box live)", func() bool { return liveBoxes(t, state) == 1 })
}

// A burst of creates that reach the pool spread over more than the demand
// window (a loaded host) still raises the target to the creates in flight.
func TestWarmPoolDemandCountsCreatesInFlight(t *testing.T) {
	p := newWarmPool(1, 16)
	now := time.Now()
	for i := range 8 {
		p.mu.Lock()
		p.active++
		p.demandLocked(now.Add(time.Duration(i) * 2 * demandWindow))
		p.mu.Unlock()
	}
	if p.target != 8 {
		t.Errorf("target after 8 creates in flight, %v apart: got %d, want 8", 2*demandWindow, p.target)
	}
}

// Refills start as many at once as the pool is short, within refillMax
// less the cold creates in flight, and at least one while it is short.
func TestWarmPoolRefillsLocked(t *testing.T) {
	for _, tc := range []struct {
		name                         string
		target, idle, starting, cold int
		want                         int
	}{
		{name: "full", target: 8, idle: 8, want: 0},
		{name: "short, machine free", target: 8, want: 4},
		{name: "short by 2", target: 8, idle: 6, want: 2},
		{name: "some in flight", target: 8, starting: 3, want: 1},
		{name: "cold creates take the room", target: 8, cold: 2, want: 2},
		{name: "cold creates fill the machine: one refill still", target: 8, cold: 6, want: 1},
		{name: "cold creates fill the machine, one in flight", target: 8, cold: 6, starting: 1, want: 0},
		{name: "more in flight than room", target: 8, cold: 3, starting: 2, want: 0},
	} {
		p := newWarmPool(1, 16)
		p.refillMax = 4
		p.target, p.starting, p.cold = tc.target, tc.starting, tc.cold
		p.idle = make([]*warmBox, tc.idle)
		if got := p.refillsLocked(); got != tc.want {
			t.Errorf("%s: refills to start: got %d, want %d", tc.name, got, tc.want)
		}
	}
}

// A pool short of several boxes refills them in parallel (up to
// refillMax), not two at a time: N creates in a row after a burst are
// served warm only if refills keep up.
func TestWarmPoolRefillsInParallel(t *testing.T) {
	old := defaultRefillMax
	defaultRefillMax = 4
	t.Cleanup(func() { defaultRefillMax = old })
	release := make(chan struct{})
	gd := &gatedDriver{entered: make(chan string, 16), gate: func(ctx context.Context) {
		select {
		case <-release:
		case <-ctx.Done():
		}
	}}
	m, state := poolEnv(t, 6, 6, gd)
	for i := range 4 {
		select {
		case <-gd.entered:
		case <-time.After(10 * time.Second):
			t.Fatalf("refills in flight at once: got %d, want 4", i)
		}
	}
	m.pool.mu.Lock()
	starting, more := m.pool.starting, m.pool.refillsLocked()
	m.pool.mu.Unlock()
	if starting != 4 || more != 0 {
		t.Errorf("with 4 refills held: got %d in flight and %d more allowed, want 4 and 0", starting, more)
	}
	close(release)
	waitFor(t, "the pool to fill (6 boxes)", func() bool {
		idle, _ := poolState(m)
		return len(idle) == 6
	})
	m.Close()
	if n := liveBoxes(t, state); n != 0 {
		t.Errorf("after Close: got %d live boxes, want 0", n)
	}
}

// holdFirst returns a gate that holds the first Create until release is
// closed (or its ctx ends) and lets every later one through.
func holdFirst(release <-chan struct{}) func(ctx context.Context) {
	var once sync.Once
	return func(ctx context.Context) {
		first := false
		once.Do(func() { first = true })
		if !first {
			return
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
	}
}

// poolWaiters is how many creates wait for a refill.
func poolWaiters(m *Manager) int {
	m.pool.mu.Lock()
	defer m.pool.mu.Unlock()
	return len(m.pool.waiters)
}

// A create that finds the pool empty while a refill is in flight waits for
// that refill's box instead of making its own cold: on a small machine the
// cold create beside the refill only split the CPU between two boxes, and
// under sustained demand nearly every create went cold.
func TestWarmPoolCreateWaitsForRefill(t *testing.T) {
	release := make(chan struct{})
	gd := &gatedDriver{entered: make(chan string, 16), gate: holdFirst(release)}
	m, state := poolEnv(t, 1, 1, gd)
	refilling := <-gd.entered // the first refill, held
	type res struct {
		id  string
		err error
	}
	done := make(chan res, 1)
	go func() {
		sb, err := m.Create(context.Background(), &sbxv1.CreateSandboxRequest{})
		done <- res{sb.GetId(), err}
	}()
	var got res
	waitFor(t, "the create to wait for the refill (or to end)", func() bool {
		select {
		case got = <-done:
			return true
		default:
			return poolWaiters(m) == 1
		}
	})
	if got.id == "" && got.err == nil {
		close(release)
		got = <-done
	}
	if got.err != nil {
		t.Fatal(got.err)
	}
	if got.id != refilling {
		t.Errorf("sandbox id: got %s, want %s (the box the refill in flight made, not a cold one)", got.id, refilling)
	}
	if err := m.Destroy(context.Background(), got.id); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitTeardowns(context.Background()); err != nil {
		t.Fatal(err)
	}
	m.Close()
	if n := liveBoxes(t, state); n != 0 {
		t.Errorf("after Close: got %d live boxes, want 0", n)
	}
}

// A create waiting for a refill when the daemon stops goes on cold (and
// meets the stopping daemon there) instead of hanging, and the refill's
// box, finished after the stop began, is destroyed: nothing is left.
func TestWarmPoolStopWithCreateWaiting(t *testing.T) {
	release := make(chan struct{})
	gd := &gatedDriver{entered: make(chan string, 16), gate: holdFirst(release)}
	m, state := poolEnv(t, 1, 1, gd)
	<-gd.entered
	done := make(chan error, 1)
	go func() {
		sb, err := m.Create(context.Background(), &sbxv1.CreateSandboxRequest{})
		if err == nil {
			err = m.Destroy(context.Background(), sb.GetId())
		}
		done <- err
	}()
	waitFor(t, "the create to wait for the refill", func() bool { return poolWaiters(m) == 1 })
	closed := make(chan struct{})
	go func() { closeWithin(t, m, runtime.ProbeTimeout); close(closed) }()
	waitFor(t, "the waiter to be sent away", func() bool { return poolWaiters(m) == 0 })
	close(release)
	<-closed
	<-done // created cold or refused by the stopping manager: either way it ended
	if n := liveBoxes(t, state); n != 0 {
		t.Errorf("after Close: got %d live boxes, want 0", n)
	}
}

// noHostImage is a driver that cannot run the host image (kubernetes).
type noHostImage struct{ runtime.Driver }

func (d noHostImage) Info(ctx context.Context) runtime.Info {
	info := d.Driver.Info(ctx)
	info.Capabilities = slices.DeleteFunc(slices.Clone(info.Capabilities), func(c runtime.Capability) bool { return c == runtime.CapHostImage })
	return info
}

// TestNoWarmPoolWithoutHostImage: a default runtime that cannot run the
// host image gets no warm pool (its refills of host-image boxes would all
// fail), and no box is started for one.
func TestNoWarmPoolWithoutHostImage(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	drv, err := fake.New(fake.Config{StateDir: dir + "/fake", AgentPath: testutil.AgentBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{
		Store: st, Drivers: map[string]runtime.Driver{"fake": noHostImage{drv}}, DefaultRuntime: "fake",
		Defaults: runtime.Resources{MemoryBytes: 64 << 20, CPUMillis: 500, Pids: 64, DiskBytes: 16 << 20},
		Limits:   testLimits, WarmPool: 2, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if m.pool != nil {
		t.Errorf("warm pool made for a default runtime without the host image, want none")
	}
}
