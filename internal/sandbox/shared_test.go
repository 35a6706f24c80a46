package sandbox

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/fake"
	"github.com/sbxdev/sbx/internal/runtime/kubernetes/k8stest"
	"github.com/sbxdev/sbx/internal/store"
	"github.com/sbxdev/sbx/internal/store/kubestore"
	"github.com/sbxdev/sbx/internal/tenant"
	"github.com/sbxdev/sbx/internal/testutil"
)

// memShared is a SharedStore in memory with kubestore's semantics
// (destroying is final, names unique per tenant, versions bumped on every
// write), for testing the manager's shared mode without a cluster.
type memShared struct {
	mu   sync.Mutex
	recs map[string]store.Record
	n    int
	// ledger is the usage ledger (UsageLedger): tenant → id → usage.
	ledger map[string]map[string]tenant.Usage
}

func newMemShared() *memShared { return &memShared{recs: map[string]store.Record{}} }

func (s *memShared) bumpLocked(r *store.Record) {
	s.n++
	r.Version = fmt.Sprint(s.n)
}

func (s *memShared) Insert(_ context.Context, r *store.Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.recs[r.ID]; ok {
		return fmt.Errorf("id %s: %w", r.ID, errdefs.ErrAlreadyExists)
	}
	for _, o := range s.recs {
		if r.Name != "" && o.Name == r.Name && o.Tenant == r.Tenant {
			return fmt.Errorf("name %s: %w", r.Name, errdefs.ErrAlreadyExists)
		}
	}
	s.bumpLocked(r)
	s.recs[r.ID] = *r
	return nil
}

func (s *memShared) modify(r *store.Record, change func(cur *store.Record)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.recs[r.ID]
	if !ok || cur.State == "destroying" {
		return fmt.Errorf("sandbox %s: %w", r.ID, errdefs.ErrNotFound)
	}
	change(&cur)
	s.bumpLocked(&cur)
	s.recs[r.ID] = cur
	r.Version = cur.Version
	return nil
}

func (s *memShared) Update(_ context.Context, r *store.Record) error {
	return s.modify(r, func(c *store.Record) {
		c.State, c.Handle, c.ExpiresAtMs, c.LastActiveAtMs, c.StateDetail = r.State, r.Handle, r.ExpiresAtMs, r.LastActiveAtMs, r.StateDetail
	})
}

func (s *memShared) UpdateSpec(_ context.Context, r *store.Record) error {
	return s.modify(r, func(c *store.Record) { c.Spec, c.Labels, c.ExpiresAtMs = r.Spec, r.Labels, r.ExpiresAtMs })
}

func (s *memShared) MarkDestroying(_ context.Context, r *store.Record) error {
	return s.modify(r, func(c *store.Record) {
		delete(s.ledger[c.Tenant], c.ID)
		c.State, c.Handle, c.StateDetail, c.Name, c.DestroyingSinceMs = r.State, r.Handle, r.StateDetail, "", nowMs()
	})
}

func (s *memShared) TouchMany(_ context.Context, la map[string]int64) error {
	for id, ms := range la {
		_ = s.modify(&store.Record{ID: id}, func(c *store.Record) { c.LastActiveAtMs = max(c.LastActiveAtMs, ms) })
	}
	return nil
}

func (s *memShared) Delete(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.recs[id]; ok {
		delete(s.ledger[r.Tenant], id)
	}
	delete(s.recs, id)
	return nil
}

func (s *memShared) Get(_ context.Context, id string) (*store.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.recs[id]
	if !ok {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return &r, nil
}

func (s *memShared) ByName(_ context.Context, tenantName, name string) (*store.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.recs {
		if r.Name == name && r.Tenant == tenantName {
			return &r, nil
		}
	}
	return nil, fmt.Errorf("name %s: %w", name, errdefs.ErrNotFound)
}

func (s *memShared) List(_ context.Context) ([]*store.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*store.Record
	for _, r := range s.recs {
		out = append(out, &r)
	}
	return out, nil
}

// sharedBackends are the SharedStores the replica tests run on: memory
// always, the real kubestore when SBX_TEST_KUBECONFIG names a cluster.
func sharedBackends(t *testing.T) map[string]func(t *testing.T) SharedStore {
	out := map[string]func(t *testing.T) SharedStore{
		"memory": func(*testing.T) SharedStore { return newMemShared() },
	}
	if os.Getenv(k8stest.DirEnv) == "" {
		t.Logf("no %s: the replica tests run on the in-memory store only", k8stest.DirEnv)
		return out
	}
	out["kubernetes"] = func(t *testing.T) SharedStore {
		c := k8stest.Get(t)
		s, err := kubestore.New(c.Client, c.Namespace(t, "sbx-replicas"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	return out
}

// replicas are managers sharing one store and one fake driver state dir
// (the fake's boxes are reachable from every replica, as pods are).
type replicas struct {
	t    *testing.T
	st   SharedStore
	dir  string
	mgrs []*Manager
}

func newReplicas(t *testing.T, st SharedStore, n int) *replicas {
	r := &replicas{t: t, st: st, dir: t.TempDir()}
	for range n {
		r.mgrs = append(r.mgrs, r.start())
	}
	t.Cleanup(func() {
		ctx := context.Background()
		recs, _ := st.List(ctx)
		for _, m := range r.mgrs {
			for _, rec := range recs {
				_ = m.Destroy(ctx, rec.ID)
			}
		}
		for _, m := range r.mgrs {
			m.Close()
		}
		// Whatever is left (a record a test left destroying) dies here.
		drv := r.driver()
		_ = drv.Cleanup(ctx, nil)
	})
	return r
}

func (r *replicas) driver() *fake.Driver {
	drv, err := fake.New(fake.Config{StateDir: r.dir + "/fake", AgentPath: testutil.AgentBinary(r.t)})
	if err != nil {
		r.t.Fatal(err)
	}
	return drv
}

// start starts one more replica.
func (r *replicas) start() *Manager {
	// Every replica's fake can change limits (as the kubernetes driver can).
	var drv runtime.Driver = &updatingDriver{Driver: r.driver()}
	mgr, err := New(Config{
		Store: r.st, Drivers: map[string]runtime.Driver{"fake": drv}, DefaultRuntime: "fake",
		Defaults: runtime.Resources{MemoryBytes: 64 << 20, CPUMillis: 500, Pids: 64, DiskBytes: 16 << 20},
		Limits:   testLimits, TickInterval: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		r.t.Fatal(err)
	}
	if err := mgr.Recover(context.Background()); err != nil {
		r.t.Fatal(err)
	}
	mgr.Run()
	return mgr
}

func helloVia(m *Manager, ref string) error {
	conn, release, err := m.Agent(context.Background(), ref)
	if err != nil {
		return err
	}
	defer release()
	_, err = conn.Hello(context.Background())
	return err
}

// TestReplicasServeAnySandbox: a sandbox made through one replica is
// found by id and by name, listed, reached, stopped, started, updated and
// destroyed through another, and each replica sees the other's changes.
func TestReplicasServeAnySandbox(t *testing.T) {
	for name, mk := range sharedBackends(t) {
		t.Run(name, func(t *testing.T) {
			r := newReplicas(t, mk(t), 2)
			a, b := r.mgrs[0], r.mgrs[1]
			ctx := context.Background()
			sb, err := a.Create(ctx, &sbxv1.CreateSandboxRequest{Name: "web", Labels: map[string]string{"app": "x"}})
			if err != nil {
				t.Fatal(err)
			}
			for _, ref := range []string{sb.Id, "web"} {
				got, err := b.Describe(ctx, ref, false)
				if err != nil {
					t.Fatalf("Describe(%q) on the other replica: %v", ref, err)
				}
				if got.Id != sb.Id || got.State != sbxv1.SandboxState_SANDBOX_STATE_RUNNING {
					t.Errorf("Describe(%q) on B = %s %v, want %s running", ref, got.Id, got.State, sb.Id)
				}
			}
			if err := helloVia(b, "web"); err != nil {
				t.Errorf("reaching the agent through B: %v", err)
			}
			list, err := b.List(ctx, []string{"app=x"})
			if err != nil || len(list) != 1 || list[0].Id != sb.Id {
				t.Errorf("List on B = %v, %v; want [%s]", list, err, sb.Id)
			}
			// A change through B is seen through A.
			if _, err := b.Stop(ctx, "web"); err != nil {
				t.Fatalf("Stop through B: %v", err)
			}
			if got, err := a.Describe(ctx, "web", false); err != nil || got.State != sbxv1.SandboxState_SANDBOX_STATE_STOPPED {
				t.Errorf("A after B stopped it: %v, %v; want stopped", got.GetState(), err)
			}
			if _, err := a.Start(ctx, "web"); err != nil {
				t.Fatalf("Start through A: %v", err)
			}
			if err := helloVia(b, sb.Id); err != nil {
				t.Errorf("B reaching it after A started it: %v", err)
			}
			// Names stay unique across replicas.
			if _, err := b.Create(ctx, &sbxv1.CreateSandboxRequest{Name: "web"}); !errdefs.IsAlreadyExists(err) {
				t.Errorf("second create of name web through B: got %v, want already exists", err)
			}
			// Destroy through B; A no longer serves it and the name is free
			// for A at once.
			if err := b.Destroy(ctx, "web"); err != nil {
				t.Fatalf("Destroy through B: %v", err)
			}
			for _, ref := range []string{sb.Id, "web"} {
				if _, err := a.Describe(ctx, ref, false); !errdefs.IsNotFound(err) {
					t.Errorf("Describe(%q) on A after B destroyed it: got %v, want not found", ref, err)
				}
			}
			if err := a.Destroy(ctx, sb.Id); !errdefs.IsNotFound(err) {
				t.Errorf("second destroy through A: got %v, want not found", err)
			}
			again, err := a.Create(ctx, &sbxv1.CreateSandboxRequest{Name: "web"})
			if err != nil {
				t.Fatalf("re-creating name web through A: %v", err)
			}
			if got, err := b.Describe(ctx, "web", false); err != nil || got.Id != again.Id {
				t.Errorf("B resolves web to %v (%v), want the new %s", got.GetId(), err, again.Id)
			}
		})
	}
}

// TestReplicaNameRace: replicas creating one name at once: one sandbox.
func TestReplicaNameRace(t *testing.T) {
	for name, mk := range sharedBackends(t) {
		t.Run(name, func(t *testing.T) {
			r := newReplicas(t, mk(t), 3)
			ctx := context.Background()
			var wg sync.WaitGroup
			errs := make([]error, len(r.mgrs))
			for i, m := range r.mgrs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, errs[i] = m.Create(ctx, &sbxv1.CreateSandboxRequest{Name: "one"})
				}()
			}
			wg.Wait()
			won := 0
			for i, err := range errs {
				switch {
				case err == nil:
					won++
				case !errdefs.IsAlreadyExists(err):
					t.Errorf("replica %d: got %v, want nil or already exists", i, err)
				}
			}
			if won != 1 {
				t.Errorf("%d replicas created name one, want 1 (%v)", won, errs)
			}
			recs, err := r.st.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) != 1 {
				t.Errorf("%d records after the race, want 1", len(recs))
			}
		})
	}
}

// TestReplicaGoneOthersServe: a replica that stops (its memory gone)
// leaves its sandboxes to the others; one it left half-destroyed is torn
// down by another once DefaultTeardownGrace has passed.
func TestReplicaGoneOthersServe(t *testing.T) {
	for name, mk := range sharedBackends(t) {
		t.Run(name, func(t *testing.T) {
			r := newReplicas(t, mk(t), 1)
			a := r.mgrs[0]
			ctx := context.Background()
			keep, err := a.Create(ctx, &sbxv1.CreateSandboxRequest{Name: "keep"})
			if err != nil {
				t.Fatal(err)
			}
			half, err := a.Create(ctx, &sbxv1.CreateSandboxRequest{Name: "half"})
			if err != nil {
				t.Fatal(err)
			}
			a.Close()
			r.mgrs = r.mgrs[:0]
			// A died after marking "half" destroying, before its teardown.
			rec, err := r.st.Get(ctx, half.Id)
			if err != nil {
				t.Fatal(err)
			}
			rec.State, rec.StateDetail = "destroying", "destroyed"
			if err := r.st.MarkDestroying(ctx, rec); err != nil {
				t.Fatal(err)
			}
			b := r.start()
			r.mgrs = append(r.mgrs, b)
			if err := helloVia(b, "keep"); err != nil {
				t.Errorf("B reaching A's sandbox after A stopped: %v", err)
			}
			if got, err := b.Describe(ctx, keep.Id, false); err != nil || got.Name != "keep" {
				t.Errorf("B Describe = %v, %v", got, err)
			}
			// Within the grace B leaves the teardown to A; after it, B does it.
			if err := b.syncAll(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := r.st.Get(ctx, half.Id); err != nil {
				t.Fatalf("record torn down within the grace: %v", err)
			}
			rec, _ = r.st.Get(ctx, half.Id)
			old := *rec
			old.DestroyingSinceMs = nowMs() - DefaultTeardownGrace.Milliseconds() - 1
			if !b.sweepRecord(ctx, &old) {
				t.Fatal("sweepRecord did not take over a teardown past its grace")
			}
			if _, err := r.st.Get(ctx, half.Id); !errdefs.IsNotFound(err) {
				t.Errorf("record after the sweep: got %v, want not found", err)
			}
			var h runtime.Handle
			h.ID, h.Driver = half.Id, "fake"
			if _, err := r.driver().Recover(ctx, h); err == nil {
				t.Errorf("the half-destroyed box still answers after the sweep")
			}
		})
	}
}

// TestReplicaNameFreedElsewhere: a name destroyed through one replica is
// free at once through another that still holds the old sandbox in its
// memory (no lookup in between to drop it).
func TestReplicaNameFreedElsewhere(t *testing.T) {
	for name, mk := range sharedBackends(t) {
		t.Run(name, func(t *testing.T) {
			r := newReplicas(t, mk(t), 2)
			a, b := r.mgrs[0], r.mgrs[1]
			ctx := context.Background()
			old, err := a.Create(ctx, &sbxv1.CreateSandboxRequest{Name: "reused"})
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Destroy(ctx, "reused"); err != nil {
				t.Fatalf("destroy through B: %v", err)
			}
			sb, err := a.Create(ctx, &sbxv1.CreateSandboxRequest{Name: "reused"})
			if err != nil {
				t.Fatalf("create of the freed name through A: %v", err)
			}
			if sb.Id == old.Id {
				t.Errorf("new sandbox has the old id %s", old.Id)
			}
		})
	}
}
