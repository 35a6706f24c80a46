package metrics

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/events"
	"github.com/sbxdev/sbx/internal/sandbox"
	"github.com/sbxdev/sbx/internal/tenant"
)

// MaxSandboxSeries bounds the sandboxes with per-sandbox series in one
// scrape (the first by id; sbx_sandbox_series_omitted counts the rest), so
// a scrape's size stays bounded whatever the number of sandboxes.
const MaxSandboxSeries = 1000

// Storage is what the daemon's images, volumes and codebases hold.
type Storage struct {
	Images, Volumes, Codebases int64
}

// Config wires Metrics.
type Config struct {
	Logger  *slog.Logger
	Sampler *Sampler
	Events  *events.Bus
	// PoolSize returns the warm pool's ready boxes (nil: no pool).
	PoolSize func() int
	// Storage measures storage (nil: no storage series); it runs on the
	// sampler's goroutine every StorageEvery samples, never in a scrape.
	Storage      func(ctx context.Context) (Storage, error)
	StorageEvery int
}

// Metrics holds the daemon's Prometheus metrics. Safe for concurrent use.
type Metrics struct {
	cfg Config
	log *slog.Logger
	// reg holds the daemon-level collectors (admin and single-user owner).
	reg *prometheus.Registry

	creates, destroys, failures *prometheus.CounterVec
	poolHits                    prometheus.Counter
	ooms, pidsHits              prometheus.Counter
	images                      *prometheus.CounterVec
	latency                     *prometheus.HistogramVec
	requests                    *prometheus.CounterVec
	cycle                       prometheus.Histogram
	storage                     *prometheus.GaugeVec

	mu sync.Mutex
	// execs counts each sandbox's exec_started events, dropped its
	// connections the port proxy refused at its limit. Both guarded by mu;
	// a sandbox's entries go with its destroyed event.
	execs, dropped map[string]int64
}

// New returns Metrics registered on the event bus.
func New(cfg Config) *Metrics {
	if cfg.StorageEvery <= 0 {
		cfg.StorageEvery = 6
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m := &Metrics{cfg: cfg, log: cfg.Logger, reg: prometheus.NewRegistry(), execs: map[string]int64{}, dropped: map[string]int64{}}
	m.creates = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sbx_sandbox_creates_total",
		Help: "Sandboxes created, by how (cold: started for the create, warm: taken from the warm pool)."}, []string{"how"})
	m.destroys = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sbx_sandbox_destroys_total",
		Help: "Sandboxes destroyed, by reason (user, timeout, idle, parent, failed)."}, []string{"reason"})
	m.failures = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sbx_sandbox_failures_total",
		Help: "Sandboxes that failed, by reason (create, oom, crashed)."}, []string{"reason"})
	m.poolHits = prometheus.NewCounter(prometheus.CounterOpts{Name: "sbx_warm_pool_hits_total", Help: "Creates served by a warm box."})
	m.ooms = prometheus.NewCounter(prometheus.CounterOpts{Name: "sbx_oom_kills_total", Help: "Processes killed by their sandbox's memory limit (as sampled)."})
	m.pidsHits = prometheus.NewCounter(prometheus.CounterOpts{Name: "sbx_pids_limit_hits_total", Help: "Forks refused at their sandbox's PID limit (as sampled)."})
	m.images = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sbx_images_total", Help: "Images pulled (or imported) and built."}, []string{"how"})
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sbx_operation_duration_seconds",
		Help:    "Duration of sandbox operations at the API (create, destroy; exec: a command's whole run).",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}}, []string{"op"})
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sbx_api_requests_total",
		Help: "API calls by procedure and result code."}, []string{"procedure", "code"})
	m.cycle = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sbx_sampler_cycle_seconds",
		Help: "Time one sample of every sandbox took.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)})
	m.storage = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sbx_storage_bytes",
		Help: "Bytes held by images, volumes and codebases (all tenants)."}, []string{"kind"})
	m.reg.MustRegister(m.creates, m.destroys, m.failures, m.poolHits, m.ooms, m.pidsHits, m.images, m.latency, m.requests, m.cycle,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), &daemonCollector{m: m})
	if cfg.Storage != nil {
		m.reg.MustRegister(m.storage)
	}
	if cfg.Events != nil {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sbx_event_subscribers", Help: "Open event streams."},
			func() float64 { return float64(cfg.Events.Subscribers()) }))
		cfg.Events.OnPublish(m.count)
	}
	if cfg.PoolSize != nil {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sbx_warm_pool_size", Help: "Warm boxes ready."},
			func() float64 { return float64(cfg.PoolSize()) }))
	}
	if s := cfg.Sampler; s != nil {
		s.mu.Lock()
		s.onCycle = m.sampled
		s.mu.Unlock()
	}
	return m
}

// sampled runs after each sample: the cycle's duration, and the storage
// every StorageEvery cycles.
func (m *Metrics) sampled(d time.Duration) {
	m.cycle.Observe(d.Seconds())
	if m.cfg.Storage == nil {
		return
	}
	if n, _ := m.cfg.Sampler.Cycles(); (n-1)%int64(m.cfg.StorageEvery) != 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if st, err := m.cfg.Storage(ctx); err == nil {
		m.storage.WithLabelValues("images").Set(float64(st.Images))
		m.storage.WithLabelValues("volumes").Set(float64(st.Volumes))
		m.storage.WithLabelValues("codebases").Set(float64(st.Codebases))
	}
}

// count is the event bus hook: it runs under the bus's lock, so it only
// increments.
func (m *Metrics) count(r events.Record) {
	e := r.Event
	switch e.GetType() {
	case sbxv1.EventType_EVENT_TYPE_CREATED:
		m.creates.WithLabelValues(e.GetReason()).Inc()
		if e.GetReason() == "warm" {
			m.poolHits.Inc()
		}
	case sbxv1.EventType_EVENT_TYPE_DESTROYED:
		m.destroys.WithLabelValues(e.GetReason()).Inc()
		m.forget(e.GetSandboxId())
	case sbxv1.EventType_EVENT_TYPE_FAILED:
		m.failures.WithLabelValues(e.GetReason()).Inc()
		if e.GetReason() == "create" {
			m.forget(e.GetSandboxId())
		}
	case sbxv1.EventType_EVENT_TYPE_EXEC_STARTED:
		m.mu.Lock()
		m.execs[e.GetSandboxId()]++
		m.mu.Unlock()
	case sbxv1.EventType_EVENT_TYPE_OOM:
		m.ooms.Add(float64(e.GetCount()))
	case sbxv1.EventType_EVENT_TYPE_PIDS_LIMIT:
		m.pidsHits.Add(float64(e.GetCount()))
	case sbxv1.EventType_EVENT_TYPE_IMAGE_PULLED:
		m.images.WithLabelValues("pulled").Inc()
	case sbxv1.EventType_EVENT_TYPE_IMAGE_BUILT:
		m.images.WithLabelValues("built").Inc()
	}
}

func (m *Metrics) forget(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.execs, id)
	delete(m.dropped, id)
}

// Dropped counts a connection to sandbox id that the port proxy refused
// at the sandbox's limit.
func (m *Metrics) Dropped(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dropped[id]++
}

// Counts returns sandbox id's execs and refused connections.
func (m *Metrics) Counts(id string) (execs, dropped int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.execs[id], m.dropped[id]
}

// Execs returns how many commands sandbox id has run through the API.
func (m *Metrics) Execs(id string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.execs[id]
}

// Observe records an operation's duration ("create", "destroy", "exec").
func (m *Metrics) Observe(op string, d time.Duration) {
	m.latency.WithLabelValues(op).Observe(d.Seconds())
}

// Called counts an API call by procedure and result code.
func (m *Metrics) Called(procedure string, err error) {
	m.requests.WithLabelValues(procedure, codeOf(err)).Inc()
}

func codeOf(err error) string {
	if err == nil {
		return "ok"
	}
	if ce := new(connect.Error); errors.As(err, &ce) {
		return ce.Code().String()
	}
	return connect.CodeUnknown.String()
}

// seesDaemon reports whether p may see daemon-wide series and events: the
// admin token, and the single-user owner (no tenants; the zero Principal).
func seesDaemon(p tenant.Principal) bool {
	return p.Admin || p.Tenant == "" && p.Scope == "" && p.Only == ""
}

// SeesDaemon is seesDaemon for the API edge (daemon events).
func SeesDaemon(p tenant.Principal) bool { return seesDaemon(p) }

// Handler serves GET /metrics for the request's Principal (set by the
// front's token check) in the Prometheus text format: per-sandbox series
// of the sandboxes it may see (sandbox.CanSee), and the daemon-level ones
// for the admin token and the single-user owner only. A scrape reads the
// sampler's cache and counters; it calls no driver.
func (m *Metrics) Handler() http.Handler {
	format := expfmt.NewFormat(expfmt.TypeTextPlain)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "sbx: /metrics takes GET", http.StatusMethodNotAllowed)
			return
		}
		p := tenant.FromContext(r.Context())
		w.Header().Set("Content-Type", string(format))
		if r.Method == http.MethodHead {
			return
		}
		if seesDaemon(p) {
			mfs, err := m.reg.Gather()
			if err != nil {
				m.log.Warn("gathering the daemon's metrics", "err", err)
			}
			enc := expfmt.NewEncoder(w, format)
			for _, mf := range mfs {
				if err := enc.Encode(mf); err != nil {
					return
				}
			}
		}
		_ = m.writeBoxSeries(w, func(o *sandbox.Observation) bool { return sandbox.CanSee(p, o.Tenant, o.Parent) })
	})
}
