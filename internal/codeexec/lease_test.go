package codeexec

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/store"
)

// leaseStore is a ProcessLeaser in memory with kubestore's lease rules,
// shared by the registries of several "replicas".
type leaseStore struct {
	mu      sync.Mutex
	recs    map[string]store.ProcessRecord
	refused map[string]int // refused LeaseProcess calls by holder
}

func (s *leaseStore) PutProcess(_ context.Context, r *store.ProcessRecord) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recs[r.ID] = *r
	return nil
}

func (s *leaseStore) GetProcess(_ context.Context, id string) (*store.ProcessRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.recs[id]
	if !ok {
		return nil, fmt.Errorf("process %s: %w", id, errdefs.ErrNotFound)
	}
	return &r, nil
}

func (s *leaseStore) DeleteProcess(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.recs, id)
	return nil
}

func (s *leaseStore) ListProcesses(_ context.Context, kind string) ([]*store.ProcessRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*store.ProcessRecord
	for _, r := range s.recs {
		if r.Kind == kind {
			out = append(out, &r)
		}
	}
	return out, nil
}

func (s *leaseStore) LeaseProcess(_ context.Context, id, holder string, until time.Time) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.recs[id]
	if !ok {
		return "", fmt.Errorf("process %s: %w", id, errdefs.ErrNotFound)
	}
	if r.Lease.Holder != "" && r.Lease.Holder != holder && time.Now().UnixMilli() < r.Lease.UntilMs {
		if s.refused == nil {
			s.refused = map[string]int{}
		}
		s.refused[holder]++
		return "", fmt.Errorf("in use: %w", errdefs.ErrUnavailable)
	}
	last := r.Lease.Last
	r.Lease = store.ProcessLease{Holder: holder, UntilMs: until.UnixMilli(), Last: holder}
	s.recs[id] = r
	return last, nil
}

func (s *leaseStore) ReleaseProcess(_ context.Context, id, holder string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.recs[id]; ok && r.Lease.Holder == holder {
		r.Lease.Holder, r.Lease.UntilMs = "", 0
		s.recs[id] = r
	}
	return nil
}

// newReplicaRegistry is one replica's registry of contexts over st: its
// restore "attaches" by registering a fresh fakeProc, counting attaches.
func newReplicaRegistry(st *leaseStore, attaches *int) *registry[*fakeProc] {
	g := &registry[*fakeProc]{kind: store.ProcessContext, noun: "context", what: "code context", proc: "kernel",
		log: slog.New(slog.DiscardHandler), agents: noAgents{}, live: map[string]*fakeProc{}}
	g.useStore(st)
	g.restore = func(_ context.Context, r *store.ProcessRecord) error {
		*attaches++
		g.put(&fakeProc{id: r.ID, sandbox: r.SandboxID})
		return nil
	}
	return g
}

// TestSharedUseMovesTheAttachment: replicas sharing a store run commands in
// one context in turn; each re-attaches only when another had it since, and
// the one it was taken from lets its attachment go without closing the
// process (a takeover must never kill what another replica now runs).
func TestSharedUseMovesTheAttachment(t *testing.T) {
	st := &leaseStore{recs: map[string]store.ProcessRecord{}}
	var attachesA, attachesB int
	a, b := newReplicaRegistry(st, &attachesA), newReplicaRegistry(st, &attachesB)
	// A opened ctx-1: live there, its record naming A as the last holder.
	procA := &fakeProc{id: "ctx-1", sandbox: "sb-1"}
	a.put(procA)
	if err := st.PutProcess(context.Background(), &store.ProcessRecord{ID: "ctx-1", Kind: store.ProcessContext, SandboxID: "sb-1", Lease: a.newLease()}); err != nil {
		t.Fatal(err)
	}
	var used []string
	use := func(g *registry[*fakeProc], name string) *fakeProc {
		t.Helper()
		var got *fakeProc
		if err := g.use(context.Background(), "ctx-1", func(p *fakeProc) error { got = p; used = append(used, name); return nil }); err != nil {
			t.Fatalf("use through %s: %v", name, err)
		}
		return got
	}
	if got := use(a, "A"); got != procA || attachesA != 0 {
		t.Errorf("A's first use: got %p with %d attaches, want its own %p and none", got, attachesA, procA)
	}
	procB := use(b, "B")
	if attachesB != 1 {
		t.Errorf("B attaches: got %d, want 1", attachesB)
	}
	if procA.closed.Load() {
		t.Errorf("B's use closed A's process, want it left alone")
	}
	if got := use(b, "B"); got != procB || attachesB != 1 {
		t.Errorf("B's second use: got %p with %d attaches, want %p and 1", got, attachesB, procB)
	}
	// Back on A: its old attachment is stale, so it lets it go and re-attaches.
	if got := use(a, "A"); got == procA || attachesA != 1 || !procA.detached.Load() || procA.closed.Load() {
		t.Errorf("A after B: same proc %v, attaches %d, old detached %v closed %v; want a new attach, the old one detached and not closed",
			got == procA, attachesA, procA.detached.Load(), procA.closed.Load())
	}
	if r, _ := st.GetProcess(context.Background(), "ctx-1"); r.Lease.Holder != "" {
		t.Errorf("lease after the uses: held by %q, want released", r.Lease.Holder)
	}
}

// TestSharedUseSerialises: a command through B waits for A's to end.
func TestSharedUseSerialises(t *testing.T) {
	st := &leaseStore{recs: map[string]store.ProcessRecord{}}
	var n1, n2 int
	a, b := newReplicaRegistry(st, &n1), newReplicaRegistry(st, &n2)
	if err := st.PutProcess(context.Background(), &store.ProcessRecord{ID: "ctx-1", Kind: store.ProcessContext, SandboxID: "sb-1"}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var events []string
	log := func(e string) { mu.Lock(); events = append(events, e); mu.Unlock() }
	inA, releaseA := make(chan struct{}), make(chan struct{})
	doneA := make(chan error)
	go func() {
		doneA <- a.use(context.Background(), "ctx-1", func(*fakeProc) error {
			log("A start")
			close(inA)
			<-releaseA
			log("A end")
			return nil
		})
	}()
	<-inA
	doneB := make(chan error)
	go func() {
		doneB <- b.use(context.Background(), "ctx-1", func(*fakeProc) error { log("B start"); log("B end"); return nil })
	}()
	// B is waiting once the lease A holds has refused it.
	for {
		st.mu.Lock()
		n := st.refused[b.holder]
		st.mu.Unlock()
		if n > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(releaseA)
	if err := <-doneA; err != nil {
		t.Fatal(err)
	}
	if err := <-doneB; err != nil {
		t.Fatal(err)
	}
	want := []string{"A start", "A end", "B start", "B end"}
	if fmt.Sprint(events) != fmt.Sprint(want) {
		t.Errorf("order: got %v, want %v", events, want)
	}
	// A waiting replica gives up with its caller's context.
	if _, err := a.lease(context.Background(), "ctx-1"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := b.use(ctx, "ctx-1", func(*fakeProc) error { return nil }); err == nil {
		t.Errorf("use through B while A holds the lease: got nil, want the context's error")
	}
}
