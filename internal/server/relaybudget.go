package server

import (
	"context"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/sbxdev/sbx/internal/agentconn"
)

// The daemon relays a command's output from the agent to the client on its
// own CPU, outside the sandbox's CPU quota (the agent's side of it is
// inside). Undecoded forwarding (relayExec's data sink) makes a byte cheap,
// but a box with CPUs to spare could still flood as fast as the daemon
// relays, and a frame costs the daemon about as much as a few KiB of data
// whatever it holds. So the output relayed for one sandbox, over all its
// commands together, is held to a budget of bytes per second in which each
// event costs its size plus RelayFrameCost: at the default rate that is a
// small fraction of one core per sandbox however the box writes. Relaying
// past the budget waits, which stops reading from the agent and so, once
// the agent's socket is full, the command's writes: backpressure, never a
// buffer.

// DefaultRelayBytesPerSecond is StreamLimits.RelayBytesPerSecond's default:
// more than a default sandbox can write (its one CPU's worth of agent
// encodes about 150 MB/s here), about 0.1 s of daemon CPU per second.
const DefaultRelayBytesPerSecond = 256 << 20

// RelayFrameCost is what one output event costs from a sandbox's relay
// budget on top of its size: about the daemon's CPU for a frame's read,
// inspection and write, counted in bytes of data that cost as much.
const RelayFrameCost = 4 << 10

// relayBurst is how far ahead of its rate a sandbox may relay: a few
// frames' worth, so a command's output in short bursts never waits.
const relayBurst = 1 << 20

// relayBudgets holds one token bucket per sandbox with output being relayed.
type relayBudgets struct {
	rate rate.Limit // bytes per second; 0: no budget

	mu sync.Mutex
	// byID are the buckets of sandboxes with a relay running, with how
	// many relays hold each.
	byID map[string]*relayBudget
}

// relayBudget is one sandbox's bucket; nil spends freely.
type relayBudget struct {
	lim  *rate.Limiter
	refs int
}

func newRelayBudgets(bytesPerSecond int64) *relayBudgets {
	return &relayBudgets{rate: rate.Limit(bytesPerSecond), byID: make(map[string]*relayBudget)}
}

// acquire returns sandbox id's budget (shared by all its relays) and the
// func that lets it go when the relay ends.
func (b *relayBudgets) acquire(id string) (*relayBudget, func()) {
	if b == nil || b.rate <= 0 {
		return nil, func() {}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	rb := b.byID[id]
	if rb == nil {
		rb = &relayBudget{lim: rate.NewLimiter(b.rate, relayBurst)}
		b.byID[id] = rb
	}
	rb.refs++
	return rb, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if rb.refs--; rb.refs == 0 {
			delete(b.byID, id)
		}
	}
}

// short reports whether the budget lacks what an event of n bytes costs
// right now: a relay holding output back for the next frame sends it
// instead of letting it wait out the budget.
func (rb *relayBudget) short(n int) bool {
	return rb != nil && rb.lim.TokensAt(time.Now()) < float64(n+RelayFrameCost)
}

// spend takes an event of n bytes from the budget, waiting until it has
// them or ctx ends (a wait is never refused for ending after ctx's
// deadline, as rate.Limiter.WaitN would: the deadline is the command's to
// meet).
func (rb *relayBudget) spend(ctx context.Context, n int) error {
	if rb == nil {
		return nil
	}
	n += RelayFrameCost
	for n > 0 {
		step := min(n, relayBurst)
		r := rb.lim.ReserveN(time.Now(), step)
		if d := r.Delay(); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				r.Cancel()
				return agentconn.ContextError(ctx)
			}
		}
		n -= step
	}
	return nil
}
