package image

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// gatedRegistry counts manifest GETs and holds every blob GET until open
// is closed.
type gatedRegistry struct {
	manifests atomic.Int64
	blobs     atomic.Int64
	open      chan struct{}
	once      sync.Once
}

// release lets blob GETs through.
func (g *gatedRegistry) release() { g.once.Do(func() { close(g.open) }) }

// newGated returns a gated registry whose gate opens at the latest when
// the test ends (else a failing test hangs in the server's Close).
func newGated(t *testing.T) (*gatedRegistry, string) {
	g := &gatedRegistry{open: make(chan struct{})}
	reg := startRegistry(t, g.wrap)
	t.Cleanup(g.release)
	return g, reg
}

func (g *gatedRegistry) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/manifests/") {
			g.manifests.Add(1)
		}
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/sha256:") {
			select {
			case <-g.open:
			case <-r.Context().Done():
				return
			}
			g.blobs.Add(1)
		}
		h.ServeHTTP(w, r)
	})
}

// waitWaiters waits until the pull of ref under way has n waiters.
func waitWaiters(t *testing.T, s *Store, ref string, n int) {
	t.Helper()
	r, err := parseRemoteRef(ref)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		s.pullMu.Lock()
		got := -1
		if f := s.pulls[r.Name()]; f != nil {
			f.progressMu.Lock()
			got = len(f.waiters)
			f.progressMu.Unlock()
		}
		s.pullMu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pull of %s has %d waiters; want %d", ref, got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestPullJoinsPullUnderWay(t *testing.T) {
	g, reg := newGated(t)
	s := openStore(t, t.TempDir())
	ref := reg + "/sbx/shared:v1"
	push(t, ref, imageOf(t, layerOf(t, file("a", "a")), layerOf(t, file("b", "b"))))
	g.manifests.Store(0)

	const callers = 5
	var wg sync.WaitGroup
	imgs := make([]*Image, callers)
	errs := make([]error, callers)
	var events atomic.Int64
	for i := range callers {
		wg.Go(func() {
			imgs[i], errs[i] = s.Pull(context.Background(), ref, func(Progress) { events.Add(1) })
		})
	}
	waitWaiters(t, s, ref, callers)
	g.release()
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for i, img := range imgs {
		if img.Digest != imgs[0].Digest {
			t.Errorf("caller %d got %s; want %s", i, img.Digest, imgs[0].Digest)
		}
	}
	// remote.Image reads the manifest once (HEAD aside) per pull.
	if got := g.manifests.Load(); got != 1 {
		t.Errorf("%d manifest GETs for %d concurrent pulls; want 1", got, callers)
	}
	if got := g.blobs.Load(); got != 3 { // config + 2 layers
		t.Errorf("%d blob GETs for %d concurrent pulls of 2 layers; want 3 (config and layers once)", got, callers)
	}
	if got := events.Load(); got%callers != 0 || got == 0 {
		t.Errorf("%d progress events; want the same events for each of %d callers", got, callers)
	}
}

// One caller giving up does not fail the others; all giving up cancels
// the pull, and the next Pull starts afresh.
func TestPullJoinedCallersLeave(t *testing.T) {
	g, reg := newGated(t)
	s := openStore(t, t.TempDir())
	ref := reg + "/sbx/leave:v1"
	push(t, ref, imageOf(t, layerOf(t, file("a", "a"))))

	impatient, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var errImpatient, errPatient error
	wg.Go(func() { _, errImpatient = s.Pull(impatient, ref, nil) })
	waitWaiters(t, s, ref, 1)
	var img *Image
	wg.Go(func() { img, errPatient = s.Pull(context.Background(), ref, nil) })
	waitWaiters(t, s, ref, 2)
	cancel()
	waitWaiters(t, s, ref, 1)
	g.release()
	wg.Wait()
	if !errors.Is(errImpatient, context.Canceled) {
		t.Errorf("cancelled caller: got %v, want context.Canceled", errImpatient)
	}
	if errPatient != nil || img == nil {
		t.Fatalf("the caller still waiting: got %v, want the image", errPatient)
	}

	// Everyone leaves: the pull is cancelled, and a new one succeeds.
	g2, reg2 := newGated(t)
	ref2 := reg2 + "/sbx/gone:v1"
	push(t, ref2, imageOf(t, layerOf(t, file("c", "c"))))
	ctx, cancel2 := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := s.Pull(ctx, ref2, nil); done <- err }()
	waitWaiters(t, s, ref2, 1)
	cancel2()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	waitWaiters(t, s, ref2, -1) // no pull under way any more
	g2.release()
	if _, err := s.Pull(context.Background(), ref2, nil); err != nil {
		t.Fatalf("pull after an abandoned one: %v", err)
	}
}

// A caller whose progress callback blocks (a client not reading its
// stream) stalls neither the pull nor another caller waiting for it.
func TestPullSlowProgressReader(t *testing.T) {
	g, reg := newGated(t)
	s := openStore(t, t.TempDir())
	ref := reg + "/sbx/slow:v1"
	push(t, ref, imageOf(t, layerOf(t, file("a", "a")), layerOf(t, file("b", "b"))))

	stuck := make(chan struct{})
	var once sync.Once
	unstick := func() { once.Do(func() { close(stuck) }) }
	t.Cleanup(unstick)
	slowDone := make(chan error, 1)
	go func() {
		_, err := s.Pull(context.Background(), ref, func(Progress) { <-stuck })
		slowDone <- err
	}()
	waitWaiters(t, s, ref, 1)
	fast := make(chan error, 1)
	go func() { _, err := s.Pull(context.Background(), ref, nil); fast <- err }()
	waitWaiters(t, s, ref, 2)
	g.release()
	select {
	case err := <-fast:
		if err != nil {
			t.Fatalf("the other caller: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a caller blocked in its progress callback stalled the pull for another caller")
	}
	unstick()
	if err := <-slowDone; err != nil {
		t.Errorf("the slow caller: %v", err)
	}
}
