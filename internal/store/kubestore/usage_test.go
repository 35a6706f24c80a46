package kubestore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/store"
	"github.com/sbxdev/sbx/internal/tenant"
)

// TestProcessLease: a lease refuses another holder until it is released or
// expires, and tells the next holder who had it last.
func TestProcessLease(t *testing.T) {
	stores := newStores(t, 2)
	a, b := stores[0], stores[1]
	ctx := context.Background()
	if err := a.PutProcess(ctx, &store.ProcessRecord{ID: "ctx-1", Kind: store.ProcessContext, SandboxID: "sb-1", Lease: store.ProcessLease{Last: "A"}}); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name     string
		st       *Store
		holder   string
		until    time.Duration
		release  bool
		wantLast string
		wantErr  error
	}{
		{name: "A takes it", st: a, holder: "A", until: time.Minute, wantLast: "A"},
		{name: "B is refused while A holds it", st: b, holder: "B", until: time.Minute, wantErr: errdefs.ErrUnavailable},
		{name: "A renews it", st: a, holder: "A", until: -time.Second, wantLast: "A"},
		{name: "B takes the expired lease", st: b, holder: "B", until: time.Minute, wantLast: "A"},
		{name: "B gives it back", st: b, holder: "B", release: true},
		{name: "A takes it after B", st: a, holder: "A", until: time.Minute, wantLast: "B"},
		{name: "B's stale release leaves A's lease", st: b, holder: "B", release: true},
		{name: "B is still refused", st: b, holder: "B", until: time.Minute, wantErr: errdefs.ErrUnavailable},
	}
	for _, s := range steps {
		if s.release {
			if err := s.st.ReleaseProcess(ctx, "ctx-1", s.holder); err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			continue
		}
		last, err := s.st.LeaseProcess(ctx, "ctx-1", s.holder, time.Now().Add(s.until))
		if !errors.Is(err, s.wantErr) || err == nil && last != s.wantLast {
			t.Fatalf("%s: got last %q, %v; want %q, %v", s.name, last, err, s.wantLast, s.wantErr)
		}
	}
	if _, err := a.LeaseProcess(ctx, "ctx-missing", "A", time.Now()); !errdefs.IsNotFound(err) {
		t.Errorf("lease of a missing record: got %v, want not found", err)
	}
	if err := a.ReleaseProcess(ctx, "ctx-missing", "A"); err != nil {
		t.Errorf("release of a missing record: got %v, want nil", err)
	}
}

// TestUsageLedgerRace: stores racing to reserve for one tenant admit
// exactly what the check lets through; unreserving frees room; an empty
// ledger is deleted.
func TestUsageLedgerRace(t *testing.T) {
	stores := newStores(t, 4)
	ctx := context.Background()
	const quota, tries = 5, 20
	q := tenant.Quotas{MaxSandboxes: quota}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var admitted []string
	var errs []error
	for i := range tries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("sb-%d", i)
			u := tenant.Usage{Sandboxes: 1}
			err := stores[i%len(stores)].Reserve(ctx, "acme", id, u, func(others tenant.Usage) error { return q.Admit("acme", others, u) })
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				admitted = append(admitted, id)
			} else if !errors.Is(err, errdefs.ErrResourceExhausted) {
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	if len(admitted) != quota || len(errs) > 0 {
		t.Fatalf("%d reservations racing over %d stores with max_sandboxes %d: %d admitted, errors %v; want %d", tries, len(stores), quota, len(admitted), errs, quota)
	}
	// Re-reserving an admitted id replaces its entry: not counted twice.
	if err := stores[0].Reserve(ctx, "acme", admitted[0], tenant.Usage{Sandboxes: 1}, func(others tenant.Usage) error {
		return q.Admit("acme", others, tenant.Usage{Sandboxes: 1})
	}); err != nil {
		t.Errorf("re-reserving %s: %v", admitted[0], err)
	}
	for _, id := range admitted {
		if err := stores[1].Unreserve(ctx, "acme", id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := stores[0].secrets().Get(ctx, usageObject("acme"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the emptied ledger: got %v, want it deleted", err)
	}
}

// TestUsageLedgerReconcile: the sweep drops an entry whose record is gone
// once older than the grace, keeps a younger one (a create in flight), and
// adds a record that has no entry unless the record is gone meanwhile.
func TestUsageLedgerReconcile(t *testing.T) {
	s := newStores(t, 1)[0]
	ctx := context.Background()
	one := tenant.Usage{Sandboxes: 1, MemoryBytes: 1 << 20}
	ok := func(tenant.Usage) error { return nil }
	for _, id := range []string{"sb-left", "sb-kept"} {
		if err := s.Reserve(ctx, "acme", id, one, ok); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Insert(ctx, record("sb-unledgered", "acme", "")); err != nil {
		t.Fatal(err)
	}
	held := map[string]map[string]tenant.Usage{"acme": {"sb-kept": one, "sb-unledgered": one, "sb-deleted": one}}
	if err := s.ReconcileUsage(ctx, held, 0); err != nil {
		t.Fatal(err)
	}
	_, l, err := s.getLedger(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for id := range l.Entries {
		got[id] = true
	}
	want := map[string]bool{"sb-kept": true, "sb-unledgered": true}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("ledger after reconcile: got %v, want %v", got, want)
	}
	// An entry with no record younger than the grace stays.
	if err := s.Reserve(ctx, "acme", "sb-inflight", one, ok); err != nil {
		t.Fatal(err)
	}
	if err := s.ReconcileUsage(ctx, map[string]map[string]tenant.Usage{"acme": {"sb-unledgered": one}}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, l, err = s.getLedger(ctx, "acme"); err != nil || len(l.Entries) != 3 {
		t.Errorf("ledger after a reconcile with a long grace: %v, %v; want sb-kept, sb-unledgered, sb-inflight", l, err)
	}
	// Deleting the record takes it out of the ledger.
	if err := s.Delete(ctx, "sb-unledgered"); err != nil {
		t.Fatal(err)
	}
	if _, l, err = s.getLedger(ctx, "acme"); err != nil || len(l.Entries) != 2 {
		t.Errorf("ledger after deleting sb-unledgered's record: %v, %v; want 2 entries", l, err)
	}
}
