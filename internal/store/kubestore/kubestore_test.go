package kubestore

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime/kubernetes/k8stest"
	"github.com/sbxdev/sbx/internal/store"
)

// kubeconfig returns the test cluster's kubeconfig (k8stest skips the
// test without one).
func kubeconfig(t testing.TB) string {
	t.Helper()
	return filepath.Join(k8stest.Get(t).Dir, "pki", "admin.kubeconfig")
}

func clientFor(t testing.TB, path string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatalf("load %s: %v", path, err)
	}
	cfg.QPS, cfg.Burst = 200, 400
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("client for %s: %v", path, err)
	}
	return cs
}

// newStores returns n Stores on one fresh namespace, each with a client of
// its own (as separate replicas have).
func newStores(t *testing.T, n int) []*Store {
	t.Helper()
	ns := k8stest.Get(t).Namespace(t, "sbx-kubestore")
	out := make([]*Store, n)
	for i := range out {
		s, err := New(clientFor(t, kubeconfig(t)), ns)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = s
	}
	return out
}

func record(id, tenant, name string) *store.Record {
	return &store.Record{
		ID: id, Name: name, Tenant: tenant, State: "creating",
		Spec:   json.RawMessage(`{"name":"` + name + `","env":{"A":"1"}}`),
		Labels: map[string]string{"team": "a"}, CreatedAtMs: 1000, LastActiveAtMs: 1000,
	}
}

// ignoreVersion compares records without their resourceVersion.
var ignoreVersion = cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Version" }, cmp.Ignore())

func TestRecordRoundTrip(t *testing.T) {
	s := newStores(t, 1)[0]
	ctx := context.Background()
	tests := []struct {
		name string
		rec  *store.Record
	}{
		{"named with handle", &store.Record{
			ID: "sb-aaaaaaaaaaa1", Name: "web", State: "running", Spec: json.RawMessage(`{"image":"busybox"}`),
			Handle: json.RawMessage(`{"id":"sb-aaaaaaaaaaa1","driver":"kubernetes"}`), Labels: map[string]string{"k": "v"},
			CreatedAtMs: 1, ExpiresAtMs: 2, LastActiveAtMs: 3, StateDetail: "d", ImageDigest: "sha256:x",
			Tenant: "acme", Parent: "sb-parent00000", ScopedTokenHash: "h",
		}},
		{"unnamed without handle", &store.Record{ID: "sb-aaaaaaaaaaa2", State: "creating", Spec: json.RawMessage(`{}`)}},
		{"name needing a hash", &store.Record{ID: "sb-aaaaaaaaaaa3", Name: "Ünïcode name/with:colons", Tenant: "t/x", State: "creating", Spec: json.RawMessage(`{}`)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := s.Insert(ctx, tc.rec); err != nil {
				t.Fatalf("Insert: %v", err)
			}
			if tc.rec.Version == "" {
				t.Errorf("Insert left Version empty, want the object's resourceVersion")
			}
			got, err := s.Get(ctx, tc.rec.ID)
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			if d := cmp.Diff(tc.rec, got, ignoreVersion); d != "" {
				t.Errorf("Get returned a different record (-want +got):\n%s", d)
			}
			if tc.rec.Name != "" {
				byName, err := s.ByName(ctx, tc.rec.Tenant, tc.rec.Name)
				if err != nil {
					t.Fatalf("ByName(%q, %q): %v", tc.rec.Tenant, tc.rec.Name, err)
				}
				if byName.ID != tc.rec.ID {
					t.Errorf("ByName = %s, want %s", byName.ID, tc.rec.ID)
				}
				if _, err := s.ByName(ctx, tc.rec.Tenant+"-other", tc.rec.Name); !errdefs.IsNotFound(err) {
					t.Errorf("ByName in another tenant: got %v, want not found", err)
				}
			}
		})
	}
	got, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range got {
		ids = append(ids, r.ID)
	}
	if want := []string{"sb-aaaaaaaaaaa2", "sb-aaaaaaaaaaa3", "sb-aaaaaaaaaaa1"}; !cmp.Equal(ids, want) {
		// created_at 0, 0, 1: ties broken by id.
		t.Errorf("List ids = %v, want %v (oldest first)", ids, want)
	}
}

func TestErrors(t *testing.T) {
	s := newStores(t, 1)[0]
	ctx := context.Background()
	if err := s.Insert(ctx, record("sb-bbbbbbbbbbb1", "", "n")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		do   func() error
		is   func(error) bool
		want string
	}{
		{"duplicate id", func() error { return s.Insert(ctx, record("sb-bbbbbbbbbbb1", "", "other")) }, errdefs.IsAlreadyExists, "already exists"},
		{"duplicate name", func() error { return s.Insert(ctx, record("sb-bbbbbbbbbbb2", "", "n")) }, errdefs.IsAlreadyExists, "already exists"},
		{"get missing", func() error { _, err := s.Get(ctx, "sb-missing0000"); return err }, errdefs.IsNotFound, "not found"},
		{"update missing", func() error { return s.Update(ctx, record("sb-missing0000", "", "")) }, errdefs.IsNotFound, "not found"},
		{"spec of missing", func() error { return s.UpdateSpec(ctx, record("sb-missing0000", "", "")) }, errdefs.IsNotFound, "not found"},
		{"delete missing", func() error { return s.Delete(ctx, "sb-missing0000") }, func(err error) bool { return err == nil }, "nil"},
		{"name of missing", func() error { _, err := s.ByName(ctx, "", "nobody"); return err }, errdefs.IsNotFound, "not found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.do(); !tc.is(err) {
				t.Errorf("got %v, want %s", err, tc.want)
			}
		})
	}
	// The losing duplicate-name insert left no record behind.
	if _, err := s.Get(ctx, "sb-bbbbbbbbbbb2"); !errdefs.IsNotFound(err) {
		t.Errorf("record of the insert that lost its name: got %v, want not found", err)
	}
}

// TestNameRace has writers with clients of their own (replicas) create
// sandboxes of one name at once, rounds after round: exactly one wins
// each round, the others get AlreadyExists and leave no record.
func TestNameRace(t *testing.T) {
	stores := newStores(t, 4)
	ctx := context.Background()
	const rounds, perStore = 5, 3
	for round := range rounds {
		name := fmt.Sprintf("race-%d", round)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var won []string
		lost := 0
		for i, s := range stores {
			for j := range perStore {
				wg.Add(1)
				go func() {
					defer wg.Done()
					id := fmt.Sprintf("sb-r%dw%dx%d", round, i, j)
					id += strings.Repeat("0", 15-len(id))
					err := s.Insert(ctx, record(id, "acme", name))
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						won = append(won, id)
					case errdefs.IsAlreadyExists(err):
						lost++
					default:
						t.Errorf("Insert %s: got %v, want nil or already exists", id, err)
					}
				}()
			}
		}
		wg.Wait()
		if len(won) != 1 || lost != len(stores)*perStore-1 {
			t.Fatalf("round %d: %d winners %v and %d losers, want 1 and %d", round, len(won), won, lost, len(stores)*perStore-1)
		}
		recs, err := stores[0].List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, r := range recs {
			if r.Name == name {
				n++
			}
		}
		if n != 1 {
			t.Errorf("round %d: %d records named %q, want 1", round, n, name)
		}
		got, err := stores[len(stores)-1].ByName(ctx, "acme", name)
		if err != nil || got.ID != won[0] {
			t.Errorf("round %d: ByName = %v, %v; want %s", round, got, err, won[0])
		}
	}
}

// TestStaleClaims: a name whose holder was destroyed, deleted, or whose
// writer died between record and claim is free again, and racing takers of
// a stale claim still get exactly one winner.
func TestStaleClaims(t *testing.T) {
	stores := newStores(t, 3)
	s := stores[0]
	ctx := context.Background()
	tests := []struct {
		name   string
		before func(t *testing.T, name string)
	}{
		{"holder marked destroying", func(t *testing.T, name string) {
			r := record("sb-"+name+"-old", "", name)
			mustInsert(t, s, r)
			r.State = "destroying"
			if err := s.MarkDestroying(ctx, r); err != nil {
				t.Fatal(err)
			}
		}},
		{"holder deleted, claim left (writer killed before removing it)", func(t *testing.T, name string) {
			r := record("sb-"+name+"-old", "", name)
			mustInsert(t, s, r)
			// Delete the record only, as a writer killed half-way would.
			if err := s.secrets().Delete(ctx, recordObject(r.ID), metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
		{"record without claim (writer killed before claiming)", func(t *testing.T, name string) {
			r := record("sb-"+name+"-old", "", name)
			data, _ := encode(r)
			sec := &corev1.Secret{ObjectMeta: meta(recordObject(r.ID), kindRecord, r.ID), Type: typeRecord, Data: data}
			if _, err := s.secrets().Create(ctx, sec, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.ByName(ctx, "", name); !errdefs.IsNotFound(err) {
				t.Errorf("ByName of an unclaimed record: got %v, want not found", err)
			}
		}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("stale%d", i)
			tc.before(t, name)
			var wg sync.WaitGroup
			var mu sync.Mutex
			var won []string
			for j, st := range stores {
				wg.Add(1)
				go func() {
					defer wg.Done()
					id := fmt.Sprintf("sb-%s-new%d", name, j)
					err := st.Insert(ctx, record(id, "", name))
					if err != nil && !errdefs.IsAlreadyExists(err) {
						t.Errorf("Insert %s: %v", id, err)
					}
					if err == nil {
						mu.Lock()
						won = append(won, id)
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			if len(won) != 1 {
				t.Fatalf("winners %v, want exactly one", won)
			}
			got, err := s.ByName(ctx, "", name)
			if err != nil || got.ID != won[0] {
				t.Errorf("ByName = %v, %v; want %s", got, err, won[0])
			}
		})
	}
}

func mustInsert(t *testing.T, s *Store, r *store.Record) {
	t.Helper()
	if err := s.Insert(context.Background(), r); err != nil {
		t.Fatalf("Insert %s: %v", r.ID, err)
	}
}

// TestNoLostWrites has two replicas change different fields of one record
// at once (state from one, spec and activity from the other): every change
// is in the final record, as each write is a read-check-write on the
// object's resourceVersion.
func TestNoLostWrites(t *testing.T) {
	stores := newStores(t, 2)
	ctx := context.Background()
	r := record("sb-lostwrite001", "", "lw")
	mustInsert(t, stores[0], r)
	const n = 20
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		for i := range n {
			u := *r
			u.State, u.StateDetail = "running", fmt.Sprintf("detail-%d", i)
			u.Handle = json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))
			if err := stores[0].Update(ctx, &u); err != nil {
				t.Errorf("Update: %v", err)
			}
		}
	}()
	go func() {
		defer wg.Done()
		for i := range n {
			u := *r
			u.Labels = map[string]string{"round": fmt.Sprint(i)}
			u.Spec = json.RawMessage(fmt.Sprintf(`{"round":%d}`, i))
			if err := stores[1].UpdateSpec(ctx, &u); err != nil {
				t.Errorf("UpdateSpec: %v", err)
			}
		}
	}()
	go func() {
		defer wg.Done()
		for i := range n {
			if err := stores[1].TouchMany(ctx, map[string]int64{r.ID: int64(5000 + i)}); err != nil {
				t.Errorf("TouchMany: %v", err)
			}
		}
	}()
	wg.Wait()
	got, err := stores[1].Get(ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := *r
	want.State, want.StateDetail, want.Handle = "running", fmt.Sprintf("detail-%d", n-1), json.RawMessage(fmt.Sprintf(`{"n":%d}`, n-1))
	want.Labels, want.Spec = map[string]string{"round": fmt.Sprint(n - 1)}, json.RawMessage(fmt.Sprintf(`{"round":%d}`, n-1))
	// Update's last-active (1000) is older than the touches': the latest wins.
	want.LastActiveAtMs = int64(5000 + n - 1)
	if d := cmp.Diff(&want, got, ignoreVersion); d != "" {
		t.Errorf("final record lost a write (-want +got):\n%s", d)
	}
}

// TestDestroyIsFinal: of replicas destroying one sandbox at once exactly
// one marks it, and no later write of any replica brings it back.
func TestDestroyIsFinal(t *testing.T) {
	stores := newStores(t, 3)
	ctx := context.Background()
	r := record("sb-destroyfin01", "", "fin")
	mustInsert(t, stores[0], r)
	var wg sync.WaitGroup
	errs := make([]error, len(stores))
	for i, s := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u := *r
			u.State, u.StateDetail = "destroying", fmt.Sprintf("by %d", i)
			errs[i] = s.MarkDestroying(ctx, &u)
		}()
	}
	wg.Wait()
	marked := 0
	for i, err := range errs {
		switch {
		case err == nil:
			marked++
		case !errdefs.IsNotFound(err):
			t.Errorf("MarkDestroying by %d: got %v, want nil or not found", i, err)
		}
	}
	if marked != 1 {
		t.Fatalf("%d replicas marked the sandbox destroying, want 1 (errors %v)", marked, errs)
	}
	late := *r
	late.State = "running"
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"Update", stores[1].Update(ctx, &late)},
		{"UpdateSpec", stores[2].UpdateSpec(ctx, &late)},
	} {
		if !errdefs.IsNotFound(tc.err) {
			t.Errorf("%s after destroy: got %v, want not found", tc.name, tc.err)
		}
	}
	got, err := stores[0].Get(ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != "destroying" || got.Name != "" || got.DestroyingSinceMs == 0 {
		t.Errorf("after destroy: state %q, name %q, destroying since %d; want destroying, no name, a time", got.State, got.Name, got.DestroyingSinceMs)
	}
}

// writerEnv makes the test binary a writer process (TestKill9Writer).
const writerEnv = "SBX_KUBESTORE_WRITER_NS"

// TestMain runs the writer when asked: it inserts named records one after
// another and prints each id once the API server has acknowledged it.
func TestMain(m *testing.M) {
	if ns := os.Getenv(writerEnv); ns != "" {
		os.Exit(writer(ns))
	}
	os.Exit(m.Run())
}

func writer(ns string) int {
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(os.Getenv(k8stest.DirEnv), "pki", "admin.kubeconfig"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg.QPS, cfg.Burst = 500, 1000
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	s, _ := New(cs, ns)
	ctx := context.Background()
	for i := 0; ; i++ {
		id := fmt.Sprintf("sb-kill%08d", i)
		r := record(id, "", fmt.Sprintf("k-%d", i))
		if err := s.Insert(ctx, r); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		r.State = "running"
		if err := s.Update(ctx, r); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println(id)
	}
}

// TestKill9Writer kills a writing process with SIGKILL in the middle of its
// writes: every record it had acknowledged is there, running, its name
// resolving; whatever it was writing when it died is either absent, or a
// record another writer can take the name from.
func TestKill9Writer(t *testing.T) {
	s := newStores(t, 1)[0]
	ctx := context.Background()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), writerEnv+"="+s.ns)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	var acked []string
	for len(acked) < 15 && sc.Scan() {
		acked = append(acked, sc.Text())
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// What was printed after the 15th line was acknowledged too.
	for sc.Scan() {
		acked = append(acked, sc.Text())
	}
	_ = cmd.Wait()
	if len(acked) < 15 {
		t.Fatalf("writer acknowledged %d records before dying, want at least 15", len(acked))
	}
	for i, id := range acked {
		name := fmt.Sprintf("k-%d", i)
		r, err := s.ByName(ctx, "", name)
		if err != nil {
			t.Errorf("acknowledged %s (%s): %v", id, name, err)
			continue
		}
		if r.ID != id || r.State != "running" {
			t.Errorf("%s resolves to %s in state %q, want %s running", name, r.ID, r.State, id)
		}
	}
	// The write in flight: its name is free, or held by its own record.
	next := fmt.Sprintf("k-%d", len(acked))
	taker := record("sb-taker0000001", "", next)
	err = s.Insert(ctx, taker)
	switch {
	case err == nil:
	case errdefs.IsAlreadyExists(err):
		held, herr := s.ByName(ctx, "", next)
		if herr != nil || held.ID != fmt.Sprintf("sb-kill%08d", len(acked)) {
			t.Errorf("name %s is taken by %v (%v), want the killed writer's own record", next, held, herr)
		}
	default:
		t.Errorf("Insert of the name in flight: %v", err)
	}
	t.Logf("writer acknowledged %d records before SIGKILL", len(acked))
}

// TestCheck: Check passes on a namespace the client may read; New refuses
// no namespace.
func TestCheck(t *testing.T) {
	s := newStores(t, 1)[0]
	if err := s.Check(context.Background()); err != nil {
		t.Fatalf("Check on a readable namespace: %v", err)
	}
	_, err := New(s.cs, "")
	if !errdefs.IsInvalidArgument(err) {
		t.Errorf("New without namespace: got %v, want invalid argument", err)
	}
}

func TestProcesses(t *testing.T) {
	stores := newStores(t, 2)
	ctx := context.Background()
	recs := []*store.ProcessRecord{
		{ID: "sess-b", Kind: store.ProcessSession, SandboxID: "sb-1", Program: "bash", Token: []byte{0, 1, 0xff}, CreatedAtMs: 2},
		{ID: "sess-a", Kind: store.ProcessSession, SandboxID: "sb-1", Program: "sh", Token: []byte("t"), Workdir: "/w", CreatedAtMs: 1},
		{ID: "ctx-a", Kind: store.ProcessContext, SandboxID: "sb-2", Program: "python", Token: []byte("k"), CreatedAtMs: 1},
	}
	for _, r := range recs {
		if err := stores[0].PutProcess(ctx, r); err != nil {
			t.Fatalf("PutProcess %s: %v", r.ID, err)
		}
	}
	// Replacing is allowed (PutProcess is insert-or-replace).
	recs[0].Workdir = "/replaced"
	if err := stores[1].PutProcess(ctx, recs[0]); err != nil {
		t.Fatalf("PutProcess replacing: %v", err)
	}
	got, err := stores[1].ListProcesses(ctx, store.ProcessSession)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]*store.ProcessRecord{recs[1], recs[0]}, got); d != "" {
		t.Errorf("ListProcesses(session) (-want +got):\n%s", d)
	}
	one, err := stores[1].GetProcess(ctx, "ctx-a")
	if err != nil || !cmp.Equal(one, recs[2]) {
		t.Errorf("GetProcess(ctx-a) = %v, %v; want %v", one, err, recs[2])
	}
	if err := stores[0].DeleteProcess(ctx, "ctx-a"); err != nil {
		t.Fatal(err)
	}
	if err := stores[0].DeleteProcess(ctx, "ctx-a"); err != nil {
		t.Errorf("DeleteProcess of a missing record: got %v, want nil", err)
	}
	if _, err := stores[1].GetProcess(ctx, "ctx-a"); !errdefs.IsNotFound(err) {
		t.Errorf("GetProcess after delete: got %v, want not found", err)
	}
}

// BenchmarkOps measures what shared state adds to a replica's calls: a
// lookup by id (Get) or by name (ByName: claim, then record), and a state
// change (Update: read-check-write).
func BenchmarkOps(b *testing.B) {
	c := k8stest.Get(b)
	ns := c.Namespace(b, "sbx-kubestore-bench")
	s, err := New(clientFor(b, kubeconfig(b)), ns)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	r := record("sb-benchmark001", "", "bench")
	if err := s.Insert(ctx, r); err != nil {
		b.Fatal(err)
	}
	b.Run("Get", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.Get(ctx, r.ID); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ByName", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.ByName(ctx, "", "bench"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Update", func(b *testing.B) {
		for b.Loop() {
			if err := s.Update(ctx, r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("InsertDestroyDelete", func(b *testing.B) {
		i := 0
		for b.Loop() {
			i++
			n := record(fmt.Sprintf("sb-bench%07d", i), "", fmt.Sprintf("b-%d", i))
			if err := s.Insert(ctx, n); err != nil {
				b.Fatal(err)
			}
			n.State = "destroying"
			if err := s.MarkDestroying(ctx, n); err != nil {
				b.Fatal(err)
			}
			if err := s.Delete(ctx, n.ID); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestOversizedRecord: a record past the API server's object size (a spec
// of 3 MiB) is refused as invalid argument, naming the sandbox,
// and leaves nothing behind.
func TestOversizedRecord(t *testing.T) {
	s := newStores(t, 1)[0]
	ctx := context.Background()
	r := record("sb-oversized001", "", "big")
	r.Spec = json.RawMessage(`{"env":{"A":"` + strings.Repeat("x", 3<<20) + `"}}`)
	err := s.Insert(ctx, r)
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), r.ID) {
		t.Fatalf("got %v, want invalid argument naming %s", err, r.ID)
	}
	if _, err := s.Get(ctx, r.ID); !errdefs.IsNotFound(err) {
		t.Errorf("record after the refused insert: got %v, want not found", err)
	}
}
