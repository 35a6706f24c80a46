package connlimit

import (
	"errors"
	"log/slog"
	"net"
	"time"
)

// Backoff paces a loop that keeps failing (an accept loop out of
// descriptors: EMFILE, ENFILE; a read loop hitting ENOBUFS): each failure
// in a row waits twice as long as the one before, from Min to Max, and a
// success starts over. Failures are logged once per run of them, with the
// error, and once more when the loop works again. The zero value uses 5 ms
// and 1 s and does not log.
type Backoff struct {
	Min, Max time.Duration
	Log      *slog.Logger
	What     string // e.g. "dns tcp accept"

	// Sleep waits (nil: time.Sleep; tests record the waits instead).
	Sleep func(time.Duration)

	delay  time.Duration
	failed int
}

// Failed records a failure and sleeps before the caller tries again.
func (b *Backoff) Failed(err error) {
	lo, hi := b.Min, b.Max
	if lo <= 0 {
		lo = 5 * time.Millisecond
	}
	if hi < lo {
		hi = max(lo, time.Second)
	}
	switch {
	case b.delay == 0:
		b.delay = lo
	case b.delay < hi:
		b.delay = min(2*b.delay, hi)
	}
	if b.failed == 0 && b.Log != nil {
		b.Log.Warn("failing; backing off until it works again", "what", b.What, "err", err)
	}
	b.failed++
	sleep := b.Sleep
	if sleep == nil {
		sleep = time.Sleep
	}
	sleep(b.delay)
}

// OK records a success: the next failure waits Min again.
func (b *Backoff) OK() {
	if b.failed > 0 && b.Log != nil {
		b.Log.Info("working again", "what", b.What, "failures", b.failed)
	}
	b.delay, b.failed = 0, 0
}

// Accept returns ln's next connection. Errors other than the listener's
// being closed (which is returned, wrapping net.ErrClosed) never end it:
// it backs off and tries again, so a daemon out of descriptors neither
// spins nor stops serving, and picks up again when descriptors come back.
func Accept(ln net.Listener, b *Backoff) (net.Conn, error) {
	for {
		c, err := ln.Accept()
		if err == nil {
			b.OK()
			return c, nil
		}
		if errors.Is(err, net.ErrClosed) {
			return nil, err
		}
		b.Failed(err)
	}
}
