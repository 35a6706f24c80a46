// Package metrics observes the daemon: one background Sampler reads every
// sandbox's usage at a fixed interval into a cache with a short history
// per sandbox (the Stats API and `sbx stats` read it), publishes OOM and
// PID-limit events from the counters' deltas, and Metrics serves
// Prometheus' /metrics from that cache and from counters fed by the event
// bus and the API edge, so a scrape costs no driver call however many
// sandboxes there are. It knows the sandbox manager only through Source;
// internal/daemon wires it and internal/server serves its handler.
package metrics

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/sandbox"
)

// Source is what the sampler reads (the sandbox manager).
type Source interface {
	Observe(ctx context.Context) []sandbox.Observation
	Emit(id string, ev *sbxv1.Event)
}

// Defaults of SamplerConfig.
const (
	DefaultInterval = 5 * time.Second
	DefaultHistory  = 15 * time.Minute
)

// SamplerConfig configures a Sampler; zero fields take the defaults.
type SamplerConfig struct {
	Interval time.Duration
	// History is how far back each sandbox's samples reach.
	History time.Duration
	Logger  *slog.Logger
}

// Sample is one sample of a sandbox's usage (64 bytes: a sandbox's 15
// minutes at 5 s hold 180 of them, 11.5 KiB).
type Sample struct {
	TimeMs                 int64
	CPUUsageNs             int64
	MemoryBytes            int64
	Pids                   int64
	DiskUsedBytes          int64
	NetRxBytes, NetTxBytes int64
	// CPUMillis is the CPU rate over the previous sample, in thousandths
	// of a core.
	CPUMillis int64
}

// Box is a sandbox's cached state: its latest observation, totals, and
// history (oldest first).
type Box struct {
	sandbox.Observation
	Current  Sample
	OOMKills int64
	// PidsLimitHits counts failed forks at the PID limit.
	PidsLimitHits int64
	History       []Sample
}

// series is what the sampler keeps of one sandbox. Guarded by Sampler.mu.
type series struct {
	obs  sandbox.Observation
	ring []Sample // circular, len ≤ cap = the history length
	head int
	// oomBase and pidsBase are the counters at the previous sample, for
	// the events of their deltas.
	oomBase, pidsBase int64
	// seen: the box has been observed (its bases are set).
	seen bool
}

func (s *series) last() (Sample, bool) {
	if len(s.ring) == 0 {
		return Sample{}, false
	}
	return s.ring[(s.head+len(s.ring)-1)%len(s.ring)], true
}

func (s *series) add(x Sample, max int) {
	if len(s.ring) < max {
		s.ring = append(s.ring, x)
		return
	}
	s.ring[s.head] = x
	s.head = (s.head + 1) % len(s.ring)
}

func (s *series) history() []Sample {
	out := make([]Sample, 0, len(s.ring))
	for i := range s.ring {
		out = append(out, s.ring[(s.head+i)%len(s.ring)])
	}
	return out
}

// Sampler samples every sandbox at an interval. Safe for concurrent use.
type Sampler struct {
	src      Source
	interval time.Duration
	histLen  int
	log      *slog.Logger

	mu sync.RWMutex
	// The fields below are guarded by mu.
	boxes map[string]*series
	// cycles counts samples taken; lastCycle is the duration of the latest.
	cycles    int64
	lastCycle time.Duration
	// onCycle observes each cycle's duration (Metrics' histogram).
	onCycle func(time.Duration)
}

// NewSampler returns a Sampler over src; Run starts it.
func NewSampler(src Source, cfg SamplerConfig) *Sampler {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.History <= 0 {
		cfg.History = DefaultHistory
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Sampler{src: src, interval: cfg.Interval, histLen: max(1, int(cfg.History/cfg.Interval)), log: cfg.Logger,
		boxes: map[string]*series{}}
}

// Interval is the sampling interval.
func (s *Sampler) Interval() time.Duration { return s.interval }

// Run samples until ctx ends (the first sample at once).
func (s *Sampler) Run(ctx context.Context) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		s.SampleOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// SampleOnce takes one sample of every sandbox and publishes the OOM and
// PID-limit events of the counters that rose.
func (s *Sampler) SampleOnce(ctx context.Context) {
	start := time.Now()
	obs := s.src.Observe(ctx)
	now := time.Now().UnixMilli()
	type ev struct {
		id string
		e  *sbxv1.Event
	}
	var evs []ev
	s.mu.Lock()
	first := s.cycles == 0
	live := make(map[string]bool, len(obs))
	for _, o := range obs {
		live[o.ID] = true
		se := s.boxes[o.ID]
		if se == nil {
			se = &series{}
			s.boxes[o.ID] = se
		}
		se.obs = o
		if !o.OK {
			continue
		}
		x := Sample{TimeMs: now, CPUUsageNs: o.Stats.CPUUsageNs, MemoryBytes: o.Stats.MemoryBytes, Pids: o.Stats.Pids,
			DiskUsedBytes: o.Stats.DiskUsedBytes, NetRxBytes: o.NetRxBytes, NetTxBytes: o.NetTxBytes}
		if prev, ok := se.last(); ok && x.TimeMs > prev.TimeMs && x.CPUUsageNs >= prev.CPUUsageNs {
			x.CPUMillis = (x.CPUUsageNs - prev.CPUUsageNs) / (x.TimeMs - prev.TimeMs) / 1000
		}
		se.add(x, s.histLen)
		if !se.seen {
			// A box that was there at the first sample may have counted
			// kills before this daemon started: those are no news. A box
			// seen later is new: it counted from zero.
			se.seen = true
			if first {
				se.oomBase, se.pidsBase = o.Stats.OOMKills, o.Stats.PidsLimitHits
			}
		}
		if d := o.Stats.OOMKills - se.oomBase; d > 0 {
			evs = append(evs, ev{o.ID, &sbxv1.Event{Type: sbxv1.EventType_EVENT_TYPE_OOM, Count: d,
				Detail: "the sandbox's memory limit killed a process"}})
		}
		if d := o.Stats.PidsLimitHits - se.pidsBase; d > 0 {
			evs = append(evs, ev{o.ID, &sbxv1.Event{Type: sbxv1.EventType_EVENT_TYPE_PIDS_LIMIT, Count: d,
				Detail: "forks failed at the sandbox's PID limit"}})
		}
		se.oomBase, se.pidsBase = max(se.oomBase, o.Stats.OOMKills), max(se.pidsBase, o.Stats.PidsLimitHits)
	}
	for id := range s.boxes {
		if !live[id] {
			delete(s.boxes, id)
		}
	}
	s.cycles++
	s.lastCycle = time.Since(start)
	onCycle := s.onCycle
	s.mu.Unlock()
	if onCycle != nil {
		onCycle(time.Since(start))
	}
	for _, e := range evs {
		s.src.Emit(e.id, e.e)
	}
}

// Boxes returns the cached state of the sandboxes keep accepts (all when
// keep is nil), sorted by id, with history when withHistory.
func (s *Sampler) Boxes(keep func(o *sandbox.Observation) bool, withHistory bool) []Box {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Box, 0, len(s.boxes))
	for _, se := range s.boxes {
		if keep != nil && !keep(&se.obs) {
			continue
		}
		b := Box{Observation: se.obs, OOMKills: se.oomBase, PidsLimitHits: se.pidsBase}
		b.Current, _ = se.last()
		if withHistory {
			b.History = se.history()
		}
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b Box) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Cycles returns how many samples were taken and the latest's duration.
func (s *Sampler) Cycles() (int64, time.Duration) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cycles, s.lastCycle
}
