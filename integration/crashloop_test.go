package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/crashpoint"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestCrashLoop drives a random workload (creates, execs, file writes,
// destroys, shell sessions, codebase syncs) from several clients and kill
// -9s the daemon, round after round. Most kills land exactly inside a
// create, destroy, sync or session creation: the daemon is started with one
// crash point armed (internal/crashpoint), the goroutine that reaches it
// parks there, and the test kills the daemon as soon as it says so. Other
// rounds kill when a box directory appears for a create not yet answered
// (seen from outside), or after a random delay. After each restart:
//   - every acknowledged sandbox is listed, running and execs;
//   - every acknowledged file write reads back byte for byte, every
//     acknowledged session is listed and execs, every acknowledged codebase
//     sync is in the codebase;
//   - what was not acknowledged is either all there (and works) or all gone:
//     no box listed that is not running or cannot exec, no mounts, box dirs,
//     cgroups or processes for boxes the daemon does not list, and no
//     network slot (address lease), namespace, bridge veth or firewall set
//     element for them: the daemon runs with networking on (a bridge, table
//     and /24 of its own, a pool of 2 namespaces) and boxes get random
//     policies (public, none, allow, deny ranges).
//
// At the end everything is destroyed, the daemon stopped gracefully and no
// mount, box dir, cgroup, box process, temporary dir, network slot,
// namespace, veth or firewall element may remain.
//
// Knobs (environment): SBX_CRASH_ROUNDS (default 5), SBX_CRASH_CLIENTS (3),
// SBX_CRASH_SEED (random; printed so a failure replays), SBX_CRASH_MAX_BOXES
// (8). `make soak` runs it long (scripts/soak.sh).
func TestCrashLoop(t *testing.T) {
	rounds := envInt(t, "SBX_CRASH_ROUNDS", 5)
	clients := envInt(t, "SBX_CRASH_CLIENTS", 3)
	maxBoxes := envInt(t, "SBX_CRASH_MAX_BOXES", 8)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("SBX_CRASH_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("SBX_CRASH_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("crash loop: seed %d (replay with SBX_CRASH_SEED=%d), %d rounds, %d clients", seed, seed, rounds, clients)
	rng := rand.New(rand.NewPCG(seed, seed^0x5b5))

	d, net := startCrashDaemon(t)
	pointDir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()

	// One codebase the boxes mount and sync into.
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "README"), []byte("crash loop\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cb, err := d.client().CreateCodebase(ctx, src, sbx.UploadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := &crashModel{boxes: map[string]*boxModel{}, synced: map[string][]byte{}, pendingSync: map[string][]byte{}, codebase: cb.GetCodebase().GetId(), net: net}
	kills := map[string]int{}

	for round := 0; round < rounds; round++ {
		// Choose how this round's kill is placed; a crash point needs the
		// daemon restarted with it armed.
		mode := "random"
		switch r := rng.IntN(100); {
		case r < 70:
			mode = "point:" + crashpoint.Points[rng.IntN(len(crashpoint.Points))]
		case r < 85:
			mode = "outside-create"
		}
		if point, ok := strings.CutPrefix(mode, "point:"); ok {
			clearDir(t, pointDir)
			d.kill9()
			d.env = []string{"SBX_CRASHPOINT_DIR=" + pointDir, "SBX_CRASHPOINTS=" + point}
			d.start()
			m.verify(t, ctx, d, fmt.Sprintf("round %d: restart to arm %s", round, point))
		}
		c := d.client()
		var stop atomic.Bool
		var dying atomic.Bool
		var wg sync.WaitGroup
		for i := 0; i < clients; i++ {
			wr := rand.New(rand.NewPCG(rng.Uint64(), uint64(i)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				w := &crashWorker{t: t, c: c, d: d, m: m, rng: wr, round: round, id: i, maxBoxes: maxBoxes, dying: &dying}
				for !stop.Load() {
					w.step(ctx)
				}
			}()
		}
		landed := m.waitKill(t, d, mode, pointDir, rng)
		dying.Store(true)
		d.kill9()
		stop.Store(true)
		wg.Wait()
		kills[landed]++
		t.Logf("round %d: %s: killed %s", round, mode, landed)
		d.env = nil
		d.start()
		m.verify(t, ctx, d, fmt.Sprintf("round %d (%s)", round, landed))
		if t.Failed() {
			t.Logf("replay with SBX_CRASH_SEED=%d", seed)
			return
		}
	}

	m.destroyAllAndStop(t, ctx, d)
	var phases []string
	for k, n := range kills {
		phases = append(phases, fmt.Sprintf("%s: %d", k, n))
	}
	sort.Strings(phases)
	t.Logf("kills by phase (seed %d):\n  %s", seed, strings.Join(phases, "\n  "))
	d.start() // for the harness's cleanup
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return v
}

func clearDir(t *testing.T, dir string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
}

// crashModel is what the clients were told: acknowledged state, and what is
// in doubt because the daemon died before answering.
type crashModel struct {
	mu       sync.Mutex
	codebase string
	// net is the daemon's networking (nil: off); boxes get random policies.
	net *crashNet
	// boxes by name.
	boxes map[string]*boxModel
	// synced holds acknowledged codebase syncs (path in the codebase ->
	// content); pendingSync unanswered ones.
	synced, pendingSync map[string][]byte
	// inflight counts operations under way, by kind (for random kills).
	inflight map[string]int
}

type boxState int

const (
	boxCreating   boxState = iota // create sent, not answered
	boxAlive                      // create answered
	boxDestroying                 // destroy sent, not answered
	boxDestroyed                  // destroy answered
)

type boxModel struct {
	name, id string
	state    boxState
	busy     bool // a worker holds it (one operation at a time per box)
	codebase bool
	// dns: the box has a resolver (a network mode other than none).
	dns bool
	// files: acknowledged writes; pending: unanswered ones.
	files, pending map[string][]byte
	// sessions: acknowledged session ids.
	sessions map[string]bool
}

func (m *crashModel) begin(kind string) {
	m.mu.Lock()
	if m.inflight == nil {
		m.inflight = map[string]int{}
	}
	m.inflight[kind]++
	m.mu.Unlock()
}

func (m *crashModel) end(kind string) {
	m.mu.Lock()
	m.inflight[kind]--
	m.mu.Unlock()
}

// ackedIDs are the ids of boxes whose create was answered.
func (m *crashModel) ackedIDs() map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]bool{}
	for _, b := range m.boxes {
		if b.id != "" {
			out[b.id] = true
		}
	}
	return out
}

// waitKill returns when the daemon should die, saying where it was.
func (m *crashModel) waitKill(t *testing.T, d *daemon, mode string, pointDir string, rng *rand.Rand) string {
	t.Helper()
	const patience = 30 * time.Second
	deadline := time.Now().Add(patience)
	switch {
	case strings.HasPrefix(mode, "point:"):
		point := strings.TrimPrefix(mode, "point:")
		for time.Now().Before(deadline) {
			if _, err := os.Stat(filepath.Join(pointDir, point)); err == nil {
				return "at " + point
			}
			time.Sleep(2 * time.Millisecond)
		}
		return "not at " + point + " (not reached in " + patience.String() + "): " + m.inflightString()
	case mode == "outside-create":
		boxes := filepath.Join(d.dataDir, "oci", "boxes")
		for time.Now().Before(deadline) {
			acked := m.ackedIDs()
			ents, _ := os.ReadDir(boxes)
			for _, e := range ents {
				if !acked[e.Name()] {
					return "in a create seen from outside (box dir of an unanswered create)"
				}
			}
			time.Sleep(time.Millisecond)
		}
		return "outside-create not seen: " + m.inflightString()
	}
	time.Sleep(time.Duration(rng.IntN(2000)) * time.Millisecond)
	return "at random: " + m.inflightString()
}

func (m *crashModel) inflightString() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var parts []string
	for k, n := range m.inflight {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", k, n))
		}
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "nothing in flight"
	}
	return "in flight " + strings.Join(parts, " ")
}

// crashWorker is one client.
type crashWorker struct {
	t         *testing.T
	c         *sbx.Client
	d         *daemon
	m         *crashModel
	rng       *rand.Rand
	round, id int
	n         int
	maxBoxes  int
	dying     *atomic.Bool
}

// failed reports an error the kill does not explain.
func (w *crashWorker) failed(op string, err error) {
	if !w.dying.Load() {
		w.t.Errorf("round %d client %d: %s: %v (daemon not being killed)", w.round, w.id, op, err)
	}
}

// pick takes a live box (with a codebase if cb) for one operation.
func (w *crashWorker) pick(cb bool) *boxModel {
	w.m.mu.Lock()
	defer w.m.mu.Unlock()
	var cands []*boxModel
	for _, b := range w.m.boxes {
		if b.state == boxAlive && !b.busy && (!cb || b.codebase) {
			cands = append(cands, b)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].name < cands[j].name })
	b := cands[w.rng.IntN(len(cands))]
	b.busy = true
	return b
}

func (w *crashWorker) release(b *boxModel) {
	w.m.mu.Lock()
	b.busy = false
	w.m.mu.Unlock()
}

func (w *crashWorker) alive() int {
	w.m.mu.Lock()
	defer w.m.mu.Unlock()
	n := 0
	for _, b := range w.m.boxes {
		if b.state != boxDestroyed {
			n++
		}
	}
	return n
}

func (w *crashWorker) step(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	w.n++
	op := w.rng.IntN(100)
	switch {
	case op < 25 && w.alive() < w.maxBoxes:
		w.create(ctx)
	case op < 35:
		if b := w.pick(false); b != nil {
			w.destroy(ctx, b)
		}
	case op < 45:
		if b := w.pick(false); b != nil {
			w.exec(ctx, b)
		}
	case op < 50:
		if b := w.pick(false); b != nil {
			w.resolve(ctx, b)
		}
	case op < 70:
		if b := w.pick(false); b != nil {
			w.write(ctx, b)
		}
	case op < 80:
		if b := w.pick(false); b != nil {
			w.session(ctx, b)
		}
	case op < 92:
		if b := w.pick(true); b != nil {
			w.sync(ctx, b)
		}
	default:
		w.m.begin("list")
		if _, err := w.c.List(ctx); err != nil {
			w.failed("list", err)
		}
		w.m.end("list")
	}
	if w.alive() == 0 && w.rng.IntN(2) == 0 {
		w.create(ctx)
	}
}

func (w *crashWorker) create(ctx context.Context) { w.createOpts(ctx, w.rng.IntN(3) == 0) }

// pickOrFail is pick for a test that needs a box.
func (w *crashWorker) pickOrFail(cb bool) *boxModel {
	b := w.pick(cb)
	if b == nil {
		w.t.Fatalf("no live box (with codebase: %v) left", cb)
	}
	return b
}

// createOpts creates a box (with the codebase mounted if cb).
func (w *crashWorker) createOpts(ctx context.Context, cb bool) {
	name := fmt.Sprintf("cl-%d-%d-%d", w.round, w.id, w.n)
	b := &boxModel{name: name, files: map[string][]byte{}, pending: map[string][]byte{}, sessions: map[string]bool{}, busy: true}
	opts := sbx.CreateOptions{Name: name}
	if w.m.net != nil {
		opts.Network = crashPolicy(w.rng)
		b.dns = opts.Network == nil || opts.Network.Mode != "none"
	}
	if cb {
		b.codebase = true
		opts.Codebases = []sbx.CodebaseMount{{Codebase: w.m.codebase}}
	}
	w.m.mu.Lock()
	w.m.boxes[name] = b
	w.m.mu.Unlock()
	w.m.begin("create")
	defer w.m.end("create")
	sb, err := w.c.Create(ctx, opts)
	w.m.mu.Lock()
	defer w.m.mu.Unlock()
	b.busy = false
	if err != nil {
		w.failed("create "+name, err)
		return // in doubt: boxCreating
	}
	w.d.remember(sb.ID)
	b.id, b.state = sb.ID, boxAlive
}

func (w *crashWorker) destroy(ctx context.Context, b *boxModel) {
	w.m.mu.Lock()
	b.state = boxDestroying
	w.m.mu.Unlock()
	w.m.begin("destroy")
	defer w.m.end("destroy")
	err := w.c.Sandbox(b.id).Destroy(ctx)
	w.m.mu.Lock()
	defer w.m.mu.Unlock()
	b.busy = false
	if err != nil {
		w.failed("destroy "+b.id, err)
		return // in doubt: boxDestroying
	}
	b.state = boxDestroyed
}

func (w *crashWorker) exec(ctx context.Context, b *boxModel) {
	defer w.release(b)
	w.m.begin("exec")
	defer w.m.end("exec")
	res, err := w.c.Sandbox(b.id).Run(ctx, "sh", "-c", "echo $((6*7))")
	if err != nil {
		w.failed("exec in "+b.id, err)
		return
	}
	if string(res.Stdout) != "42\n" {
		w.t.Errorf("exec in %s: got %q, want \"42\\n\"", b.id, res.Stdout)
	}
}

// resolve looks crashName up in b through the daemon's DNS forwarder
// (which, for an allow-mode box, adds the answer to the firewall).
func (w *crashWorker) resolve(ctx context.Context, b *boxModel) {
	defer w.release(b)
	if !b.dns {
		return
	}
	w.m.begin("resolve")
	defer w.m.end("resolve")
	res, err := w.c.Sandbox(b.id).Run(ctx, "getent", "ahostsv4", crashName)
	if err != nil {
		w.failed("resolve in "+b.id, err)
		return
	}
	if f := strings.Fields(string(res.Stdout)); (len(f) == 0 || f[0] != inetAllowed) && !w.dying.Load() {
		w.t.Errorf("resolve %s in %s: got %q (%s), want %s", crashName, b.id, res.Stdout, res.Stderr, inetAllowed)
	}
}

func (w *crashWorker) payload() []byte {
	data := make([]byte, 1+w.rng.IntN(96<<10))
	for i := range data {
		data[i] = byte(w.rng.Uint32())
	}
	return data
}

// writeFile writes p in b, tracking it as pending until answered.
func (w *crashWorker) writeFile(ctx context.Context, b *boxModel, p string) ([]byte, bool) {
	data := w.payload()
	w.m.mu.Lock()
	b.pending[p] = data
	w.m.mu.Unlock()
	w.m.begin("write")
	defer w.m.end("write")
	if err := w.c.Sandbox(b.id).WriteFile(ctx, p, data, 0o644); err != nil {
		w.failed("write "+p+" in "+b.id, err)
		return nil, false
	}
	w.m.mu.Lock()
	delete(b.pending, p)
	b.files[p] = data
	w.m.mu.Unlock()
	return data, true
}

func (w *crashWorker) write(ctx context.Context, b *boxModel) {
	defer w.release(b)
	w.writeFile(ctx, b, fmt.Sprintf("/root/w-%d-%d-%d", w.round, w.id, w.n))
}

func (w *crashWorker) session(ctx context.Context, b *boxModel) {
	defer w.release(b)
	w.m.begin("session")
	defer w.m.end("session")
	ss, err := w.c.Sandbox(b.id).CreateSession(ctx, sbx.SessionOptions{})
	if err != nil {
		w.failed("create session in "+b.id, err)
		return
	}
	w.m.mu.Lock()
	b.sessions[ss.ID] = true
	w.m.mu.Unlock()
	res, err := ss.Exec(ctx, "echo $((6*7))", sbx.SessionExecOptions{Timeout: 30 * time.Second})
	if err != nil {
		w.failed("session exec in "+b.id, err)
		return
	}
	if string(res.Stdout) != "42\n" {
		w.t.Errorf("session exec in %s: got %q, want \"42\\n\"", b.id, res.Stdout)
	}
}

func (w *crashWorker) sync(ctx context.Context, b *boxModel) {
	defer w.release(b)
	name := fmt.Sprintf("s-%d-%d-%d", w.round, w.id, w.n)
	data, ok := w.writeFile(ctx, b, "/workspace/"+name)
	if !ok {
		return
	}
	w.m.mu.Lock()
	w.m.pendingSync[name] = data
	w.m.mu.Unlock()
	w.m.begin("sync")
	defer w.m.end("sync")
	if _, err := w.c.SyncCodebase(ctx, b.id, sbx.SyncOptions{}); err != nil {
		w.failed("sync of "+b.id, err)
		return
	}
	w.m.mu.Lock()
	delete(w.m.pendingSync, name)
	w.m.synced[name] = data
	w.m.mu.Unlock()
}

// verify checks the restarted daemon against the model, and settles what
// was in doubt.
func (m *crashModel) verify(t *testing.T, ctx context.Context, d *daemon, when string) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	c := d.client()
	list, err := c.List(ctx)
	if err != nil {
		t.Fatalf("%s: list: %v", when, err)
	}
	listed := map[string]*sbx.Sandbox{}
	var live []string
	for _, sb := range list {
		listed[sb.Name] = sb
		live = append(live, sb.ID)
		d.remember(sb.ID)
	}
	for name, sb := range listed {
		b := m.boxes[name]
		if b == nil {
			t.Errorf("%s: sandbox %s (%s) listed that no client asked for", when, sb.ID, name)
			continue
		}
		if st := sb.Info.GetState(); st != sbxv1.SandboxState_SANDBOX_STATE_RUNNING {
			t.Errorf("%s: sandbox %s (%s) is %s, want running", when, sb.ID, name, st)
		}
	}
	for _, name := range slices.Sorted(mapKeys(m.boxes)) {
		b := m.boxes[name]
		sb, there := listed[name]
		switch b.state {
		case boxAlive:
			if !there {
				t.Errorf("%s: acknowledged sandbox %s (%s) is gone", when, b.id, name)
				continue
			}
			if sb.ID != b.id {
				t.Errorf("%s: sandbox %s has id %s, want %s", when, name, sb.ID, b.id)
			}
		case boxDestroyed:
			if there {
				t.Errorf("%s: sandbox %s (%s) whose destroy was acknowledged is listed", when, b.id, name)
			}
			continue
		case boxCreating, boxDestroying:
			if !there {
				b.state = boxDestroyed // settled: gone
				continue
			}
			b.id, b.state = sb.ID, boxAlive // settled: there
		}
		if !there {
			continue
		}
		box := c.Sandbox(sb.ID)
		ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
		res, err := box.Run(ectx, "sh", "-c", "echo $((6*7))")
		cancel()
		if err != nil || string(res.Stdout) != "42\n" {
			t.Errorf("%s: sandbox %s (%s) is listed but does not exec: %v %v", when, sb.ID, name, res, err)
			continue
		}
		for p, want := range b.files {
			got, err := box.ReadFile(ctx, p)
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("%s: acknowledged write %s in %s: read %d bytes (%v), want %d bytes byte-identical", when, p, sb.ID, len(got), err, len(want))
			}
		}
		for p, want := range b.pending {
			got, err := box.ReadFile(ctx, p)
			switch {
			case sbx.IsNotFound(err):
			case err != nil:
				t.Errorf("%s: unanswered write %s in %s: %v", when, p, sb.ID, err)
			case !bytes.Equal(got, want):
				t.Errorf("%s: unanswered write %s in %s is half there: %d bytes, want 0 or %d identical", when, p, sb.ID, len(got), len(want))
			default:
				b.files[p] = want
			}
			delete(b.pending, p)
		}
	}
	// Sessions: acknowledged ones of live boxes are listed; every listed one execs.
	sessions, err := c.Sessions(ctx, "")
	if err != nil {
		t.Fatalf("%s: list sessions: %v", when, err)
	}
	listedSess := map[string]bool{}
	for _, ss := range sessions {
		listedSess[ss.ID] = true
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		res, err := ss.Exec(sctx, "echo $((6*7))", sbx.SessionExecOptions{})
		cancel()
		if err != nil || string(res.Stdout) != "42\n" {
			t.Errorf("%s: session %s of %s is listed but does not exec: %v %v", when, ss.ID, ss.Sandbox, res, err)
		}
		if !slices.Contains(live, ss.Sandbox) {
			t.Errorf("%s: session %s listed for sandbox %s, which is not", when, ss.ID, ss.Sandbox)
		}
	}
	// No shell runs in a box that no listed session accounts for (one a
	// crash left between starting it and recording it).
	perBox := map[string]int{}
	for _, ss := range sessions {
		perBox[ss.Sandbox]++
	}
	for _, id := range live {
		ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
		res, err := c.Sandbox(id).Run(ectx, "sh", "-c", "cat /proc/[0-9]*/comm 2>/dev/null | grep -cx bash || true")
		cancel()
		if err != nil {
			continue // reported above
		}
		if got := strings.TrimSpace(string(res.Stdout)); got != strconv.Itoa(perBox[id]) {
			t.Errorf("%s: sandbox %s runs %s shells, want %d (its listed sessions)", when, id, got, perBox[id])
		}
	}
	for _, b := range m.boxes {
		if b.state != boxAlive {
			continue
		}
		for id := range b.sessions {
			if !listedSess[id] {
				t.Errorf("%s: acknowledged session %s of %s is gone", when, id, b.id)
			}
		}
	}
	// Codebase: acknowledged syncs are in it; unanswered ones all or nothing.
	var tarball bytes.Buffer
	if err := c.DownloadCodebase(ctx, m.codebase, &tarball); err != nil {
		t.Fatalf("%s: download codebase: %v", when, err)
	}
	files := tarFiles(t, tarball.Bytes())
	for p, want := range m.synced {
		if got, ok := files[p]; !ok || got != string(want) {
			t.Errorf("%s: acknowledged sync of %s: codebase has %d bytes (present %v), want %d identical", when, p, len(got), ok, len(want))
		}
	}
	for p, want := range m.pendingSync {
		if got, ok := files[p]; ok {
			if got != string(want) {
				t.Errorf("%s: unanswered sync of %s is half there: %d bytes, want %d", when, p, len(got), len(want))
			}
			m.synced[p] = want
		}
		delete(m.pendingSync, p)
	}
	if l := waitNoCrashLeaks(d, m.net, live, false); len(l) > 0 {
		t.Errorf("%s: host resources of sandboxes the daemon does not list:\n  %s", when, strings.Join(l, "\n  "))
	}
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// procState is the state letter of /proc/<pid> dir ("" if gone).
func procState(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return ""
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return ""
	}
	return string(b[i+2])
}

// destroyAllAndStop is the end of a crash test: everything is destroyed, the
// daemon stopped gracefully, and nothing may be left (crashLeaks, netLeaks).
func (m *crashModel) destroyAllAndStop(t *testing.T, ctx context.Context, d *daemon) {
	t.Helper()
	c := d.client()
	list, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		if err := sb.Destroy(ctx); err != nil {
			t.Errorf("final destroy of %s: %v", sb.ID, err)
		}
	}
	if err := c.DeleteCodebase(ctx, m.codebase); err != nil {
		t.Errorf("deleting the codebase: %v", err)
	}
	d.stop()
	if l := waitNoCrashLeaks(d, m.net, nil, true); len(l) > 0 {
		t.Errorf("after destroying everything and a graceful stop, left behind:\n  %s", strings.Join(l, "\n  "))
	}
}

// waitNoCrashLeaks is crashLeaks and n's netLeaks (stopped: after a
// graceful stop) retried for a few seconds (killed processes take a moment
// to leave /proc, veths are deleted in the background).
func waitNoCrashLeaks(d *daemon, n *crashNet, live []string, stopped bool) []string {
	var l []string
	for range 50 {
		if l = append(crashLeaks(d, live), n.netLeaks(d, live, stopped)...); len(l) == 0 {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return l
}

// crashLeaks lists what a daemon over d.dataDir left on the host for
// sandboxes not in live: mounts and box dirs under the data dir, cgroups
// under the daemon's own cgroup parent, processes in those cgroups,
// codebase layers, temporary upload and sync dirs.
func crashLeaks(d *daemon, live []string) []string {
	out := d.leaks(live...)
	keep := map[string]bool{}
	for _, id := range live {
		keep[id] = true
	}
	sum := sha256.Sum256([]byte(d.dataDir))
	parent := fmt.Sprintf("sbx-%x", sum[:4])
	cgs, _ := filepath.Glob("/sys/fs/cgroup/*/" + parent + "/*")
	cg2, _ := filepath.Glob("/sys/fs/cgroup/" + parent + "/*")
	for _, cg := range append(cgs, cg2...) {
		if fi, err := os.Stat(cg); err != nil || !fi.IsDir() || keep[filepath.Base(cg)] {
			continue
		}
		out = append(out, "cgroup "+cg)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			_, path, ok := strings.Cut(line, ":/"+parent+"/")
			if !ok {
				continue
			}
			id, _, _ := strings.Cut(path, "/")
			if st := procState(filepath.Dir(p)); !keep[id] && st != "" && st != "Z" {
				// A zombie holds nothing but its pid: reaping the
				// orphans of a killed daemon is the host init's job.
				cmd, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "cmdline"))
				out = append(out, fmt.Sprintf("process %s (state %s, %q) in cgroup of %s", filepath.Dir(p), st, bytes.ReplaceAll(cmd, []byte{0}, []byte{' '}), id))
				break
			}
		}
	}
	mounts, _ := os.ReadDir(filepath.Join(d.dataDir, "codebases", "mounts"))
	for _, e := range mounts {
		if !keep[e.Name()] {
			out = append(out, "codebase layer dir "+e.Name())
		}
	}
	tmps, _ := os.ReadDir(filepath.Join(d.dataDir, "codebases", "tmp"))
	for _, e := range tmps {
		out = append(out, "codebase temp dir "+e.Name())
	}
	syncs, _ := filepath.Glob(filepath.Join(d.dataDir, "codebases", "trees", "*", ".sync"))
	for _, s := range syncs {
		out = append(out, "sync temp dir "+s)
	}
	return out
}

// TestCrashPoints kills the daemon once at every crash point, with the
// operation that reaches it (a create with a codebase, a destroy, a codebase
// sync, a session) and checks the restarted daemon as TestCrashLoop does,
// networking on; at the end everything is destroyed and the daemon stopped
// gracefully, leaving nothing. Deterministic: each point is reached for
// sure, in every run.
// SBX_CRASH_ONLY=point,point runs only those.
func TestCrashPoints(t *testing.T) {
	d, net := startCrashDaemon(t)
	pointDir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "README"), []byte("crash points\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cb, err := d.client().CreateCodebase(ctx, src, sbx.UploadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := &crashModel{boxes: map[string]*boxModel{}, synced: map[string][]byte{}, pendingSync: map[string][]byte{}, codebase: cb.GetCodebase().GetId(), net: net}
	var dying atomic.Bool
	worker := func(round int) *crashWorker {
		return &crashWorker{t: t, c: d.client(), d: d, m: m, rng: rand.New(rand.NewPCG(uint64(round), 7)), round: round, maxBoxes: 100, dying: &dying}
	}
	// Boxes for the points that need one (a destroy, a sync, a session), made
	// before any point is armed.
	for i := range 7 {
		w := worker(-1)
		w.n = i
		w.createOpts(ctx, true)
	}
	points := crashpoint.Points
	if only := os.Getenv("SBX_CRASH_ONLY"); only != "" {
		points = strings.Split(only, ",") // replay some points only
	}
	for round, point := range points {
		d.kill9()
		clearDir(t, pointDir)
		d.env = []string{"SBX_CRASHPOINT_DIR=" + pointDir, "SBX_CRASHPOINTS=" + point}
		d.start()
		m.verify(t, ctx, d, "restart to arm "+point)
		dying.Store(false)
		w := worker(round)
		// The teardown after a destroy runs in the background: its points
		// are reached after the destroy answered.
		background := point == "destroy-killed" || point == "destroy-unrecorded"
		var victim boxModel
		done := make(chan struct{})
		go func() {
			defer close(done)
			switch {
			case strings.HasPrefix(point, "create-") || strings.HasPrefix(point, "oci-create-"):
				w.createOpts(ctx, true)
			case strings.HasPrefix(point, "destroy-"):
				b := w.pickOrFail(false)
				m.mu.Lock()
				victim = *b
				m.mu.Unlock()
				w.destroy(ctx, b)
			case strings.HasPrefix(point, "sync-"):
				w.sync(ctx, w.pickOrFail(true))
			case strings.HasPrefix(point, "session-"):
				w.session(ctx, w.pickOrFail(false))
			default:
				t.Errorf("no operation reaches crash point %s", point)
			}
		}()
		reached, answered := false, false
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline) && !reached; {
			select {
			case <-done:
				if !background {
					t.Fatalf("%s: the operation ended without reaching the crash point", point)
				}
				answered = true
			case <-time.After(5 * time.Millisecond):
			}
			_, err := os.Stat(filepath.Join(pointDir, point))
			reached = err == nil
		}
		if !reached {
			t.Fatalf("crash point %s not reached within a minute", point)
		}
		if background {
			// The destroy answers although its teardown is held at the
			// point, and the name is free for a new sandbox at once.
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: the destroy of %s did not answer while its teardown was held at the crash point (answered before: %v)", point, victim.id, answered)
			}
			sb, err := d.client().Create(ctx, sbx.CreateOptions{Name: victim.name})
			if err != nil {
				t.Fatalf("%s: creating a sandbox named %s while the destroyed %s is torn down: %v", point, victim.name, victim.id, err)
			}
			d.remember(sb.ID)
			m.mu.Lock()
			m.boxes[victim.name] = &boxModel{name: victim.name, id: sb.ID, state: boxAlive, files: map[string][]byte{}, pending: map[string][]byte{}, sessions: map[string]bool{}}
			m.mu.Unlock()
		}
		dying.Store(true)
		d.kill9()
		<-done
		d.env = nil
		d.start()
		if background {
			if _, err := d.client().Get(ctx, victim.id); !sbx.IsNotFound(err) {
				t.Errorf("killed at %s: sandbox %s, destroyed before the crash: got %v, want NotFound", point, victim.id, err)
			}
		}
		m.verify(t, ctx, d, "killed at "+point)
		if t.Failed() {
			return
		}
	}
	m.destroyAllAndStop(t, ctx, d)
	d.start() // for the harness's cleanup
}
