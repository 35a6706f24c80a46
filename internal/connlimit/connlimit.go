// Package connlimit bounds what one client of a daemon service may hold or
// ask for, and keeps accept loops alive when descriptors run out. The
// daemon's services that sandboxes (or the clients of their ports) reach —
// the DNS forwarder, the egress proxy, the port proxy — key their bounds by
// sandbox: a box at its limit has its excess refused, counted and logged
// once per burst, and its neighbours and the API do not notice.
//
// It provides a concurrent-use counter per key (Counter), a token-bucket
// rate per key (Rate), the once-per-burst refusal log both use (burstLog)
// and an accept helper that backs off on errors (Accept, Backoff). It
// imports only the standard library; internal/network, internal/server and
// the agent (its accept loops) use it.
package connlimit

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// quiet is how long a key must go without refusals for its burst to end.
const quiet = 10 * time.Second

// burstLog logs the first refusal of a burst for a key at Warn, and when
// the burst is over (quiet passes without refusals) how many there were.
// A nil log counts without logging.
type burstLog struct {
	log  *slog.Logger
	what string // e.g. "dns tcp connections"
	max  int    // the limit, for the message

	total atomic.Uint64

	mu sync.Mutex
	// bursts is guarded by mu.
	bursts map[any]*burst
}

type burst struct {
	refused uint64
	last    time.Time
}

func (b *burstLog) refused(key any, now time.Time) {
	b.total.Add(1)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.bursts == nil {
		b.bursts = map[any]*burst{}
	}
	if st := b.bursts[key]; st != nil {
		st.refused++
		st.last = now
		return
	}
	b.bursts[key] = &burst{refused: 1, last: now}
	if b.log != nil {
		b.log.Warn("limit reached: refusing the excess (logged once per burst)", "what", b.what, "key", key, "limit", b.max)
	}
	time.AfterFunc(quiet, func() { b.end(key) })
}

// end logs and forgets key's burst if it has been quiet, else checks again
// later.
func (b *burstLog) end(key any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.bursts[key]
	if st == nil {
		return
	}
	if wait := quiet - time.Since(st.last); wait > 0 {
		time.AfterFunc(wait, func() { b.end(key) })
		return
	}
	delete(b.bursts, key)
	if b.log != nil {
		b.log.Info("limit burst over", "what", b.what, "key", key, "limit", b.max, "refused", st.refused)
	}
}

// Counter bounds how many of something each key holds at once
// (connections, queries in flight). The zero value is not usable: use
// NewCounter. A max of 0 or less means no limit (but still counts).
type Counter[K comparable] struct {
	max int
	bl  burstLog

	mu sync.Mutex
	// n is guarded by mu; keys at zero are removed.
	n map[K]int
}

// NewCounter returns a counter allowing max per key; refusals are logged
// on log (nil: not logged) as what.
func NewCounter[K comparable](max int, log *slog.Logger, what string) *Counter[K] {
	return &Counter[K]{max: max, n: map[K]int{}, bl: burstLog{log: log, what: what, max: max}}
}

// Acquire takes one for k; ok is false (and the refusal counted) if k holds
// the most allowed already. Call release exactly once when done.
func (c *Counter[K]) Acquire(k K) (release func(), ok bool) {
	c.mu.Lock()
	if c.max > 0 && c.n[k] >= c.max {
		c.mu.Unlock()
		c.bl.refused(k, time.Now())
		return nil, false
	}
	c.n[k]++
	c.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.n[k]--; c.n[k] <= 0 {
				delete(c.n, k)
			}
		})
	}, true
}

// Held returns how many k holds.
func (c *Counter[K]) Held(k K) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[k]
}

// Max returns the limit per key (0 or less: none).
func (c *Counter[K]) Max() int { return c.max }

// Refused returns how many acquisitions were refused, all keys together.
func (c *Counter[K]) Refused() uint64 { return c.bl.total.Load() }

// Rate is a token bucket per key: perSec tokens a second, up to burst
// saved. A perSec of 0 or less means no limit.
type Rate[K comparable] struct {
	perSec float64
	burst  float64
	now    func() time.Time // tests
	bl     burstLog

	mu sync.Mutex
	// buckets is guarded by mu.
	buckets map[K]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

// maxIdleBuckets is how many buckets Rate keeps before it sweeps the full
// ones (a full bucket is the same as none).
const maxIdleBuckets = 4096

// NewRate returns a rate of perSec per key with bursts of burst (at least
// 1); refusals are logged on log (nil: not logged) as what.
func NewRate[K comparable](perSec, burst int, log *slog.Logger, what string) *Rate[K] {
	if burst < 1 {
		burst = 1
	}
	return &Rate[K]{perSec: float64(perSec), burst: float64(burst), now: time.Now, buckets: map[K]*bucket{},
		bl: burstLog{log: log, what: what, max: perSec}}
}

// Allow takes a token for k; false (and the refusal counted) if k has none.
func (r *Rate[K]) Allow(k K) bool {
	if r.perSec <= 0 {
		return true
	}
	now := r.now()
	r.mu.Lock()
	b := r.buckets[k]
	if b == nil {
		if len(r.buckets) >= maxIdleBuckets {
			r.sweepLocked(now)
		}
		b = &bucket{tokens: r.burst, at: now}
		r.buckets[k] = b
	}
	b.tokens = min(r.burst, b.tokens+now.Sub(b.at).Seconds()*r.perSec)
	b.at = now
	ok := b.tokens >= 1
	if ok {
		b.tokens--
	}
	r.mu.Unlock()
	if !ok {
		r.bl.refused(k, now)
	}
	return ok
}

// sweepLocked drops the buckets that have refilled completely.
func (r *Rate[K]) sweepLocked(now time.Time) {
	for k, b := range r.buckets {
		if b.tokens+now.Sub(b.at).Seconds()*r.perSec >= r.burst {
			delete(r.buckets, k)
		}
	}
}

// Refused returns how many requests were refused, all keys together.
func (r *Rate[K]) Refused() uint64 { return r.bl.total.Load() }
