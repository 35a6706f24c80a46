package metrics

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/events"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/sandbox"
	"github.com/sbxdev/sbx/internal/tenant"
)

// fakeSource is a manager with boxes set by the test.
type fakeSource struct {
	mu      sync.Mutex
	obs     []sandbox.Observation
	emitted []*sbxv1.Event
	calls   int
}

func (f *fakeSource) Observe(context.Context) []sandbox.Observation {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return append([]sandbox.Observation(nil), f.obs...)
}

func (f *fakeSource) Emit(id string, ev *sbxv1.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ev.SandboxId = id
	f.emitted = append(f.emitted, ev)
}

func (f *fakeSource) set(obs ...sandbox.Observation) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.obs = obs
}

func (f *fakeSource) takeEmitted() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, e := range f.emitted {
		out = append(out, e.GetSandboxId()+":"+strings.ToLower(strings.TrimPrefix(e.GetType().String(), "EVENT_TYPE_")))
	}
	f.emitted = nil
	return out
}

func box(id, tnt string, oom, pidsHits, cpuNs int64) sandbox.Observation {
	return sandbox.Observation{ID: id, Name: "n-" + id, Tenant: tnt, Runtime: "oci", State: sbxv1.SandboxState_SANDBOX_STATE_RUNNING, OK: true,
		Resources: runtime.Resources{MemoryBytes: 64 << 20, Pids: 100},
		Stats:     runtime.Stats{MemoryBytes: 1 << 20, OOMKills: oom, PidsLimitHits: pidsHits, CPUUsageNs: cpuNs, Pids: 3}}
}

// TestSamplerEventsFromDeltas: OOM and PID-limit events come from the
// counters' rises between samples; kills a box counted before the
// daemon's first sample are no news, a box first seen later counted from
// zero.
func TestSamplerEventsFromDeltas(t *testing.T) {
	src := &fakeSource{}
	s := NewSampler(src, SamplerConfig{Interval: time.Second, History: 3 * time.Second})
	ctx := context.Background()
	steps := []struct {
		name string
		obs  []sandbox.Observation
		want []string
	}{
		{"old kills at the first sample", []sandbox.Observation{box("a", "", 2, 5, 0)}, nil},
		{"a's OOM count rises", []sandbox.Observation{box("a", "", 3, 5, 0)}, []string{"a:oom"}},
		{"a new box that OOMed and hit its pids limit", []sandbox.Observation{box("a", "", 3, 5, 0), box("b", "", 1, 2, 0)}, []string{"b:oom", "b:pids_limit"}},
		{"nothing rose", []sandbox.Observation{box("a", "", 3, 5, 0), box("b", "", 1, 2, 0)}, nil},
		{"a's pids hits rise", []sandbox.Observation{box("a", "", 3, 6, 0)}, []string{"a:pids_limit"}},
	}
	for _, st := range steps {
		src.set(st.obs...)
		s.SampleOnce(ctx)
		got := src.takeEmitted()
		if strings.Join(got, ",") != strings.Join(st.want, ",") {
			t.Errorf("%s: events %v, want %v", st.name, got, st.want)
		}
	}
	boxes := s.Boxes(nil, false)
	if len(boxes) != 1 || boxes[0].ID != "a" {
		t.Fatalf("boxes after b went: %+v, want only a", boxes)
	}
	if boxes[0].OOMKills != 3 || boxes[0].PidsLimitHits != 6 {
		t.Errorf("a's totals: oom %d pids hits %d, want 3 and 6", boxes[0].OOMKills, boxes[0].PidsLimitHits)
	}
}

// TestSamplerHistoryBounded: a box keeps History/Interval samples, the
// newest last, whatever the number of samples taken.
func TestSamplerHistoryBounded(t *testing.T) {
	src := &fakeSource{}
	s := NewSampler(src, SamplerConfig{Interval: time.Second, History: 3 * time.Second})
	for i := range 10 {
		src.set(box("a", "", 0, 0, int64(i)*1e9))
		s.SampleOnce(context.Background())
	}
	b := s.Boxes(nil, true)[0]
	if len(b.History) != 3 {
		t.Fatalf("history holds %d samples, want 3", len(b.History))
	}
	for i, x := range b.History {
		if want := int64(7+i) * 1e9; x.CPUUsageNs != want {
			t.Errorf("history[%d].CPUUsageNs = %d, want %d (oldest first)", i, x.CPUUsageNs, want)
		}
	}
	if b.Current.CPUUsageNs != 9e9 {
		t.Errorf("current CPU %d, want 9e9", b.Current.CPUUsageNs)
	}
}

func scrape(t *testing.T, m *Metrics, p tenant.Principal) string {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req = req.WithContext(tenant.WithPrincipal(req.Context(), p))
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: status %d", rec.Code)
	}
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

// TestScrapeIsPerPrincipal: a tenant's scrape has its own sandboxes'
// series and no daemon-wide ones; the admin token's has all of both.
func TestScrapeIsPerPrincipal(t *testing.T) {
	src := &fakeSource{}
	src.set(box("sa", "acme", 0, 0, 1e9), box("sb", "beta", 0, 0, 1e9))
	s := NewSampler(src, SamplerConfig{Interval: time.Second})
	bus := events.New(events.Config{})
	m := New(Config{Sampler: s, Events: bus})
	s.SampleOnce(context.Background())
	bus.Publish(events.Record{Tenant: "acme", Event: &sbxv1.Event{Type: sbxv1.EventType_EVENT_TYPE_EXEC_STARTED, SandboxId: "sa"}})
	tests := []struct {
		name       string
		p          tenant.Principal
		want, deny []string
	}{
		{"acme", tenant.Principal{Tenant: "acme"},
			[]string{`sbx_sandbox_cpu_seconds_total{id="sa",name="n-sa"} 1`, `sbx_sandbox_execs_total{id="sa",name="n-sa"} 1`},
			[]string{`id="sb"`, "go_goroutines", "sbx_sandbox_creates_total", "process_resident_memory_bytes"}},
		{"beta", tenant.Principal{Tenant: "beta"}, []string{`id="sb"`}, []string{`id="sa"`, "go_goroutines"}},
		{"a scoped token of acme's sa sees its children only", tenant.Principal{Tenant: "acme", Scope: "sa"}, nil, []string{`id="sa"`, `id="sb"`, "go_goroutines"}},
		{"admin", tenant.Principal{Admin: true},
			[]string{`id="sa"`, `id="sb"`, "go_goroutines", "process_resident_memory_bytes", `sbx_sandboxes{runtime="oci",state="running"} 2`}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := scrape(t, m, tt.p)
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("scrape lacks %q", w)
				}
			}
			for _, d := range tt.deny {
				if strings.Contains(out, d) {
					t.Errorf("scrape has %q, which this principal may not see", d)
				}
			}
		})
	}
}

// TestScrapeBoundsSandboxes: past MaxSandboxSeries sandboxes, the rest are
// counted in sbx_sandbox_series_omitted instead of listed.
func TestScrapeBoundsSandboxes(t *testing.T) {
	src := &fakeSource{}
	var obs []sandbox.Observation
	for i := range MaxSandboxSeries + 5 {
		obs = append(obs, box(fmt.Sprintf("sb-%04d", i), "", 0, 0, 0))
	}
	src.set(obs...)
	s := NewSampler(src, SamplerConfig{})
	m := New(Config{Sampler: s})
	s.SampleOnce(context.Background())
	out := scrape(t, m, tenant.Principal{})
	if n := strings.Count(out, "sbx_sandbox_memory_limit_bytes{"); n != MaxSandboxSeries {
		t.Errorf("%d sandboxes with series, want %d", n, MaxSandboxSeries)
	}
	if !strings.Contains(out, "sbx_sandbox_series_omitted 5") {
		t.Errorf("scrape lacks sbx_sandbox_series_omitted 5")
	}
	if src.calls != 1 {
		t.Errorf("the scrape observed the sandboxes itself (%d Observe calls, want the sampler's 1)", src.calls)
	}
}

// TestScrapeParses: the whole scrape (the registry's families and the
// hand-written per-sandbox ones) is valid text format, label values
// escaped.
func TestScrapeParses(t *testing.T) {
	src := &fakeSource{}
	odd := box("sb-odd", "", 1, 0, 5e8)
	odd.Name = "quote\"back\\slash\nnewline"
	unmeasured := box("sb-new", "", 0, 0, 0)
	unmeasured.OK = false
	src.set(box("sb-a", "", 0, 0, 1e9), odd, unmeasured)
	s := NewSampler(src, SamplerConfig{})
	bus := events.New(events.Config{})
	m := New(Config{Sampler: s, Events: bus, PoolSize: func() int { return 2 }})
	s.SampleOnce(context.Background())
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(scrape(t, m, tenant.Principal{})))
	if err != nil {
		t.Fatalf("the scrape does not parse: %v", err)
	}
	for name, want := range map[string]int{
		"sbx_sandbox_memory_limit_bytes": 3, // limits of every box
		"sbx_sandbox_memory_bytes":       2, // usage of measured boxes only
		"sbx_sandbox_series_omitted":     1,
		"sbx_warm_pool_size":             1,
	} {
		if got := len(mfs[name].GetMetric()); got != want {
			t.Errorf("%s: %d series, want %d", name, got, want)
		}
	}
	var names []string
	for _, mt := range mfs["sbx_sandbox_oom_kills_total"].GetMetric() {
		for _, l := range mt.GetLabel() {
			if l.GetName() == "name" {
				names = append(names, l.GetValue())
			}
		}
	}
	if !slices.Contains(names, odd.Name) {
		t.Errorf("sandbox names in the scrape %q, want %q among them (escaped and parsed back)", names, odd.Name)
	}
}
