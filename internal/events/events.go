// Package events is the daemon's event bus: what happens to sandboxes
// (created, stopped, destroyed, OOM, exec...), images and the daemon, kept in
// a bounded ring of recent events for replay and fanned out to subscribers.
// Publishing never blocks: a subscriber that does not keep up is dropped
// (its channel closed, Dropped set) and resumes from the ring by seq. Hooks
// (the metrics' counters) see every event synchronously. It imports only
// the API's types; internal/sandbox, internal/server, internal/metrics and
// internal/daemon use it.
package events

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
)

// Record is an event with who may see it.
type Record struct {
	// Tenant owns the event's sandbox or image ("" in single-user mode);
	// Parent is the sandbox's parent (scoped tokens see their children's).
	Tenant, Parent string
	// Daemon marks daemon-wide events (only the admin and the single-user
	// owner see them).
	Daemon bool
	// Event is shared by every subscriber: never modify it after Publish.
	Event *sbxv1.Event
}

// Defaults of Config.
const (
	DefaultRingSize       = 4096
	DefaultSubBuffer      = 1024
	DefaultMaxSubscribers = 1024
	DefaultMaxPerKey      = 64
)

// Config sizes a Bus; zero fields take the defaults.
type Config struct {
	// RingSize is how many recent events are held for replay.
	RingSize int
	// SubBuffer is how many events a subscriber may lag behind before it is
	// dropped.
	SubBuffer int
	// MaxSubscribers bounds subscribers in all; MaxPerKey those of one key
	// (a tenant): each holds a buffer and a goroutine in the daemon.
	MaxSubscribers, MaxPerKey int
}

// Bus holds recent events and the subscribers. Safe for concurrent use.
type Bus struct {
	cfg Config

	mu sync.Mutex
	// The fields below are guarded by mu.
	seq   uint64
	ring  []Record // circular; ring[(head+i)%len] for i < n, oldest first
	head  int
	n     int
	subs  map[*Sub]struct{}
	keys  map[string]int // subscribers by key
	hooks []func(Record)
}

// New returns a Bus.
func New(cfg Config) *Bus {
	if cfg.RingSize <= 0 {
		cfg.RingSize = DefaultRingSize
	}
	if cfg.SubBuffer <= 0 {
		cfg.SubBuffer = DefaultSubBuffer
	}
	if cfg.MaxSubscribers <= 0 {
		cfg.MaxSubscribers = DefaultMaxSubscribers
	}
	if cfg.MaxPerKey <= 0 {
		cfg.MaxPerKey = DefaultMaxPerKey
	}
	return &Bus{cfg: cfg, ring: make([]Record, cfg.RingSize), subs: map[*Sub]struct{}{}, keys: map[string]int{}}
}

// OnPublish adds a hook called with every event, in order, after it is
// numbered. Hooks run on the publisher's goroutine under the bus's lock:
// they must be quick and must not publish.
func (b *Bus) OnPublish(f func(Record)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.hooks = append(b.hooks, f)
}

// Publish numbers r, stamps its time (unless set), keeps it in the ring and
// hands it to the hooks and matching subscribers. It never blocks on a
// subscriber. A nil Bus ignores it.
func (b *Bus) Publish(r Record) {
	if b == nil || r.Event == nil {
		return
	}
	if r.Event.TimeMs == 0 {
		r.Event.TimeMs = time.Now().UnixMilli()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	r.Event.Seq = b.seq
	if b.n < len(b.ring) {
		b.ring[(b.head+b.n)%len(b.ring)] = r
		b.n++
	} else {
		b.ring[b.head] = r
		b.head = (b.head + 1) % len(b.ring)
	}
	for _, h := range b.hooks {
		h(r)
	}
	for s := range b.subs {
		if !s.match(r) {
			continue
		}
		select {
		case s.ch <- r:
		default:
			s.dropped.Store(true)
			b.removeLocked(s)
		}
	}
}

// Sub is one subscriber.
type Sub struct {
	ch      chan Record
	key     string
	match   func(Record) bool
	dropped atomic.Bool
}

// C receives the subscriber's events; it is closed when the subscriber is
// dropped or unsubscribed.
func (s *Sub) C() <-chan Record { return s.ch }

// Dropped reports whether s was dropped for falling behind.
func (s *Sub) Dropped() bool { return s.dropped.Load() }

// ErrTooManySubscribers is returned by Subscribe at a limit.
var ErrTooManySubscribers = errors.New("too many event subscribers")

// Subscribe returns the held events that match and have a seq above
// afterSeq and a time at or after sinceMs (none when both are zero), and a
// subscriber that receives every matching event published after them. key
// (a tenant) is counted against MaxPerKey. match runs under the bus's lock:
// it must be quick.
func (b *Bus) Subscribe(key string, match func(Record) bool, afterSeq uint64, sinceMs int64) ([]Record, *Sub, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.subs) >= b.cfg.MaxSubscribers {
		return nil, nil, fmt.Errorf("%w: the daemon has %d, the most allowed: %w", ErrTooManySubscribers, len(b.subs), errdefs.ErrResourceExhausted)
	}
	if b.keys[key] >= b.cfg.MaxPerKey {
		return nil, nil, fmt.Errorf("%w: %d streams open for this tenant, the most allowed: %w", ErrTooManySubscribers, b.keys[key], errdefs.ErrResourceExhausted)
	}
	var replay []Record
	if afterSeq > 0 || sinceMs > 0 {
		for i := range b.n {
			r := b.ring[(b.head+i)%len(b.ring)]
			if r.Event.Seq > afterSeq && r.Event.TimeMs >= sinceMs && match(r) {
				replay = append(replay, r)
			}
		}
	}
	s := &Sub{ch: make(chan Record, b.cfg.SubBuffer), key: key, match: match}
	b.subs[s] = struct{}{}
	b.keys[key]++
	return replay, s, nil
}

// Unsubscribe ends s (idempotent).
func (b *Bus) Unsubscribe(s *Sub) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.removeLocked(s)
}

func (b *Bus) removeLocked(s *Sub) {
	if _, ok := b.subs[s]; !ok {
		return
	}
	delete(b.subs, s)
	if b.keys[s.key]--; b.keys[s.key] <= 0 {
		delete(b.keys, s.key)
	}
	close(s.ch)
}

// Subscribers returns how many subscribers there are.
func (b *Bus) Subscribers() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.subs)
}
