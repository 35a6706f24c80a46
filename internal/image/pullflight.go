package image

import (
	"context"
	"sync"

	"github.com/google/go-containerregistry/pkg/name"
)

// pullFlight is the pull of one normalised ref under way. Every Pull of
// that ref while it runs waits for it instead of fetching the manifest and
// layers again: concurrent creates of a missing image pull it once. The
// pull runs on a context of its own (the first caller's values, none of its
// deadlines), cancelled only when every caller waiting for it has gone, so
// that one impatient caller does not fail the others.
type pullFlight struct {
	done chan struct{} // closed when img and err are set
	img  *Image
	err  error
	// cancel ends the pull; called when the last waiter leaves early.
	cancel context.CancelFunc

	// next is guarded by the store's pullMu.
	next int

	// progressMu guards waiters: the event queue of each caller waiting
	// (nil for one without a progress callback). It is taken with pullMu
	// held, never the other way round, and never held while a callback
	// runs: each caller's callback runs on a goroutine of its own, fed
	// through a bounded queue that drops events when full, so a caller
	// that reads its progress slowly (a client not reading its stream)
	// neither stalls the pull nor the others waiting for it.
	progressMu sync.Mutex
	waiters    map[int]chan Progress
}

// progressQueue is how many events a slow caller may fall behind by before
// its events are dropped.
const progressQueue = 256

// joinPull waits for the pull of r under way, starting one if there is
// none. progress (may be nil) sees the layer events from when it joined.
func (s *Store) joinPull(ctx context.Context, r name.Reference, progress func(Progress)) (*Image, error) {
	key := r.Name()
	s.pullMu.Lock()
	f := s.pulls[key]
	if f == nil {
		fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		f = &pullFlight{done: make(chan struct{}), cancel: cancel, waiters: map[int]chan Progress{}}
		s.pulls[key] = f
		go func() {
			defer cancel()
			img, err := s.pull(fctx, r, f.report)
			s.pullMu.Lock()
			if s.pulls[key] == f {
				delete(s.pulls, key)
			}
			s.pullMu.Unlock()
			f.img, f.err = img, err
			close(f.done)
		}()
	}
	id := f.next
	f.next++
	var queue chan Progress
	forwarded := make(chan struct{})
	if progress != nil {
		queue = make(chan Progress, progressQueue)
		go func() {
			defer close(forwarded)
			for p := range queue {
				progress(p)
			}
		}()
	} else {
		close(forwarded)
	}
	f.progressMu.Lock()
	f.waiters[id] = queue
	f.progressMu.Unlock()
	s.pullMu.Unlock()

	// No callback runs once Pull has returned.
	leave := func() {
		s.leavePull(key, f, id)
		if queue != nil {
			close(queue)
		}
		<-forwarded
	}
	select {
	case <-f.done:
		leave()
		return f.img, f.err
	case <-ctx.Done():
		leave()
		return nil, ctx.Err()
	}
}

// leavePull removes waiter id from f; the last to leave a pull that has not
// finished cancels it, and a later Pull of the same ref starts afresh.
func (s *Store) leavePull(key string, f *pullFlight, id int) {
	s.pullMu.Lock()
	defer s.pullMu.Unlock()
	f.progressMu.Lock()
	delete(f.waiters, id)
	left := len(f.waiters)
	f.progressMu.Unlock()
	if left > 0 {
		return
	}
	select {
	case <-f.done:
	default:
		if s.pulls[key] == f {
			delete(s.pulls, key)
		}
		f.cancel()
	}
}

// report queues a layer event for every waiter with a callback, dropping
// it for one whose queue is full.
func (f *pullFlight) report(p Progress) {
	f.progressMu.Lock()
	defer f.progressMu.Unlock()
	for _, q := range f.waiters {
		if q == nil {
			continue
		}
		select {
		case q <- p:
		default:
		}
	}
}
