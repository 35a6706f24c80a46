package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/events"
	"github.com/sbxdev/sbx/internal/metrics"
	"github.com/sbxdev/sbx/internal/sandbox"
	"github.com/sbxdev/sbx/internal/tenant"
)

// Observer is the API's view of the daemon's observing: the event bus,
// the sampler and the Prometheus metrics. Observed puts it in every
// request's context, so that the tenancy interceptor (on every service)
// counts calls and publishes image events, and relayExec (the Exec RPCs
// and the exec upgrade) publishes exec events, without each handler
// knowing.
type Observer struct {
	Mgr     *sandbox.Manager
	Bus     *events.Bus
	Sampler *metrics.Sampler
	Metrics *metrics.Metrics
	// Done, when closed, ends the event streams (the daemon is stopping:
	// an HTTP server's graceful shutdown waits for them otherwise).
	Done <-chan struct{}
}

type observerKey struct{}

// Observed has h's requests carry o (wrap the fronts with it).
func Observed(h http.Handler, o *Observer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), observerKey{}, o)))
	})
}

func observerFrom(ctx context.Context) *Observer {
	o, _ := ctx.Value(observerKey{}).(*Observer)
	return o
}

// timedOps are the procedures whose durations the metrics histogram.
var timedOps = map[string]string{
	sbxv1connect.SandboxServiceCreateSandboxProcedure:  "create",
	sbxv1connect.SandboxServiceDestroySandboxProcedure: "destroy",
}

// called records an API call that ended with err after d: its count and
// duration, and the image events of image calls that succeeded (first is
// the call's first request message).
func (o *Observer) called(ctx context.Context, procedure string, first any, d time.Duration, err error) {
	if o == nil {
		return
	}
	if o.Metrics != nil {
		o.Metrics.Called(procedure, err)
		if op, ok := timedOps[procedure]; ok && err == nil {
			o.Metrics.Observe(op, d)
		}
	}
	if err != nil || o.Bus == nil {
		return
	}
	var ev *sbxv1.Event
	switch m := first.(type) {
	case *sbxv1.PullImageRequest:
		ev = &sbxv1.Event{Type: sbxv1.EventType_EVENT_TYPE_IMAGE_PULLED, Reason: "pull", Detail: m.GetRef()}
	case *sbxv1.ImportImageRequest:
		ev = &sbxv1.Event{Type: sbxv1.EventType_EVENT_TYPE_IMAGE_PULLED, Reason: "import", Detail: m.GetHeader().GetTag()}
	case *sbxv1.BuildImageRequest:
		ev = &sbxv1.Event{Type: sbxv1.EventType_EVENT_TYPE_IMAGE_BUILT, Reason: "build", Detail: m.GetTag()}
	default:
		return
	}
	o.Bus.Publish(events.Record{Tenant: tenant.FromContext(ctx).Tenant, Event: ev})
}

// firstMessage keeps the first message a streaming handler receives.
type firstMessage struct {
	connect.StreamingHandlerConn
	first any
}

func (c *firstMessage) Receive(m any) error {
	err := c.StreamingHandlerConn.Receive(m)
	if err == nil && c.first == nil {
		c.first = m
	}
	return err
}

// execStarted publishes that a command started in sandbox ref, and
// returns the func to call with its exit (nil if it did not report one).
func (o *Observer) execStarted(ctx context.Context, start *sbxv1.ExecRequest) func(ex *sbxv1.ExecExited) {
	if o == nil || o.Bus == nil {
		return func(*sbxv1.ExecExited) {}
	}
	id, err := o.Mgr.Resolve(ctx, start.GetSandbox())
	if err != nil {
		return func(*sbxv1.ExecExited) {}
	}
	// argv[0] only (a shell command is "sh"): arguments may carry secrets.
	cmd := "sh"
	if argv := start.GetArgv(); len(argv) > 0 {
		cmd = path.Base(argv[0])
	}
	o.Mgr.Emit(id, &sbxv1.Event{Type: sbxv1.EventType_EVENT_TYPE_EXEC_STARTED, Detail: cmd})
	began := time.Now()
	return func(ex *sbxv1.ExecExited) {
		if o.Metrics != nil && ex != nil {
			o.Metrics.Observe("exec", time.Since(began))
		}
		ev := &sbxv1.Event{Type: sbxv1.EventType_EVENT_TYPE_EXEC_ENDED, Detail: cmd}
		switch {
		case ex == nil:
			ev.Reason = "aborted"
		case ex.GetOomKilled():
			ev.Reason = "oom"
		case ex.GetTimedOut():
			ev.Reason = "timeout"
		}
		ev.ExitCode, ev.Signal = ex.GetExitCode(), ex.GetSignal()
		o.Mgr.Emit(id, ev)
	}
}

// ObserveServer serves the ObserveService and /metrics.
type ObserveServer struct {
	o *Observer
}

var _ sbxv1connect.ObserveServiceHandler = (*ObserveServer)(nil)

// AddObserve serves the observe service and GET /metrics.
func (s *Server) AddObserve(o *Observer) { s.observe = &ObserveServer{o: o} }

// eventsKeepalive is how often a quiet event stream says it is alive.
const eventsKeepalive = 15 * time.Second

// MaxEventFilters bounds the filters of one Events call.
const MaxEventFilters = 100

func (s *ObserveServer) Events(ctx context.Context, req *connect.Request[sbxv1.EventsRequest], out *connect.ServerStream[sbxv1.EventsResponse]) error {
	r := req.Msg
	if n := len(r.GetTypes()) + len(r.GetSandboxes()) + len(r.GetLabelSelectors()); n > MaxEventFilters {
		return toConnect(fmt.Errorf("%d filters: at most %d: %w", n, MaxEventFilters, errdefs.ErrInvalidArgument))
	}
	sel, err := sandbox.ParseSelectors(r.GetLabelSelectors())
	if err != nil {
		return toConnect(err)
	}
	for _, t := range r.GetTypes() {
		if _, ok := sbxv1.EventType_name[int32(t)]; !ok || t == sbxv1.EventType_EVENT_TYPE_UNSPECIFIED {
			return toConnect(fmt.Errorf("event type %d: unknown: %w", t, errdefs.ErrInvalidArgument))
		}
	}
	p := tenant.FromContext(ctx)
	types, refs := r.GetTypes(), r.GetSandboxes()
	match := func(rec events.Record) bool {
		e := rec.Event
		if rec.Daemon && !metrics.SeesDaemon(p) || !rec.Daemon && !sandbox.CanSee(p, rec.Tenant, rec.Parent) {
			return false
		}
		if len(types) > 0 && !slices.Contains(types, e.GetType()) {
			return false
		}
		if len(refs) > 0 && (e.GetSandboxId() == "" || !slices.Contains(refs, e.GetSandboxId()) && (e.GetSandboxName() == "" || !slices.Contains(refs, e.GetSandboxName()))) {
			return false
		}
		return len(sel) == 0 || e.GetSandboxId() != "" && sandbox.Matches(sel, e.GetLabels())
	}
	// Streams count against a bucket per key (events.Config.MaxPerKey):
	// the tenant's, the admin token's, and one that all the tenant's
	// boxes' scoped tokens share, so that code in a box cannot take its
	// tenant's (the single-user owner's too) streams.
	key := p.Tenant
	switch {
	case p.Admin:
		key = "\x00admin"
	case p.Scope != "":
		key = p.Tenant + "\x00boxes"
	}
	replay, sub, err := s.o.Bus.Subscribe(key, match, r.GetAfterSeq(), r.GetSinceMs())
	if err != nil {
		return toConnect(err)
	}
	defer s.o.Bus.Unsubscribe(sub)
	var last uint64
	send := func(rec events.Record) error {
		last = rec.Event.GetSeq()
		return out.Send(&sbxv1.EventsResponse{Kind: &sbxv1.EventsResponse_Event{Event: rec.Event}})
	}
	for _, rec := range replay {
		if err := send(rec); err != nil {
			return err
		}
	}
	if r.GetNoFollow() {
		return nil
	}
	if err := out.Send(&sbxv1.EventsResponse{Kind: &sbxv1.EventsResponse_Live{Live: true}}); err != nil {
		return err
	}
	tick := time.NewTicker(eventsKeepalive)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.o.Done:
			return connect.NewError(connect.CodeUnavailable, errors.New("the daemon is stopping"))
		case <-tick.C:
			if err := out.Send(&sbxv1.EventsResponse{Kind: &sbxv1.EventsResponse_Keepalive{Keepalive: true}}); err != nil {
				return err
			}
		case rec, ok := <-sub.C():
			if !ok {
				if sub.Dropped() {
					return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf(
						"event stream fell behind (more than %d events unread) and was dropped; resume with after_seq %d", events.DefaultSubBuffer, last))
				}
				return nil
			}
			if rec.Event.GetSeq() <= last {
				continue // already replayed
			}
			if err := send(rec); err != nil {
				return err
			}
			tick.Reset(eventsKeepalive)
		}
	}
}

// MaxStatsSandboxes bounds the sandboxes one Stats call names.
const MaxStatsSandboxes = 1000

func (s *ObserveServer) Stats(ctx context.Context, req *connect.Request[sbxv1.StatsRequest]) (*connect.Response[sbxv1.StatsResponse], error) {
	refs := req.Msg.GetSandboxes()
	if len(refs) > MaxStatsSandboxes {
		return nil, toConnect(fmt.Errorf("%d sandboxes: at most %d: %w", len(refs), MaxStatsSandboxes, errdefs.ErrInvalidArgument))
	}
	ids := make(map[string]bool, len(refs))
	for _, ref := range refs {
		id, err := s.o.Mgr.Resolve(ctx, ref)
		if err != nil {
			return nil, toConnect(err)
		}
		ids[id] = true
	}
	p := tenant.FromContext(ctx)
	keep := func(o *sandbox.Observation) bool {
		return sandbox.CanSee(p, o.Tenant, o.Parent) && (len(ids) == 0 || ids[o.ID])
	}
	resp := &sbxv1.StatsResponse{IntervalMs: s.o.Sampler.Interval().Milliseconds()}
	for _, b := range s.o.Sampler.Boxes(keep, req.Msg.GetHistory()) {
		e := &sbxv1.SandboxStatsEntry{
			SandboxId: b.ID, SandboxName: b.Name, State: metrics.StateWord(b.State),
			MemoryLimitBytes: b.Resources.MemoryBytes, DiskLimitBytes: b.Resources.DiskBytes,
			PidsLimit: b.Resources.Pids, CpuLimitMillis: b.Resources.CPUMillis,
			OomKills: b.OOMKills, PidsLimitHits: b.PidsLimitHits, MemoryPeakBytes: b.Stats.MemoryPeakBytes,
		}
		if s.o.Metrics != nil {
			e.Execs = s.o.Metrics.Execs(b.ID)
		}
		if b.Current.TimeMs != 0 {
			e.Current = sampleProto(b.Current)
		}
		for _, x := range b.History {
			e.History = append(e.History, sampleProto(x))
		}
		resp.Sandboxes = append(resp.Sandboxes, e)
	}
	return connect.NewResponse(resp), nil
}

func sampleProto(x metrics.Sample) *sbxv1.StatsSample {
	return &sbxv1.StatsSample{TimeMs: x.TimeMs, CpuUsageNs: x.CPUUsageNs, CpuMillis: x.CPUMillis, MemoryBytes: x.MemoryBytes,
		Pids: x.Pids, DiskUsedBytes: x.DiskUsedBytes, NetRxBytes: x.NetRxBytes, NetTxBytes: x.NetTxBytes}
}

// HasStores reports whether tenant t's stores exist (it has used them
// since they were made), without opening them: the daemon's storage
// metrics sum those, and opening every tenant's stores to find zeros would
// make directories for tenants that never stored anything.
func (ts *TenantStores) HasStores(t string) bool {
	if t == "" {
		return true
	}
	if !tenant.ValidName(t) {
		return false
	}
	ts.mu.Lock()
	_, ok := ts.byName[t]
	ts.mu.Unlock()
	if ok {
		return true
	}
	_, err := os.Stat(filepath.Join(ts.dir, t))
	return err == nil
}
