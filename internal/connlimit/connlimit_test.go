package connlimit

import (
	"errors"
	"net"
	"slices"
	"syscall"
	"testing"
	"time"
)

func TestCounterPerKey(t *testing.T) {
	c := NewCounter[string](2, nil, "test")
	var rel []func()
	for i, tt := range []struct {
		key  string
		want bool
	}{
		{"a", true}, {"a", true}, {"a", false}, {"b", true}, {"b", true}, {"b", false}, {"a", false},
	} {
		r, ok := c.Acquire(tt.key)
		if ok != tt.want {
			t.Fatalf("acquire #%d for %s: got %v, want %v", i, tt.key, ok, tt.want)
		}
		if ok {
			rel = append(rel, r)
		}
	}
	if got := c.Refused(); got != 3 {
		t.Errorf("refused: got %d, want 3", got)
	}
	rel[0]()
	rel[0]() // a second release is a no-op
	if got := c.Held("a"); got != 1 {
		t.Errorf("held by a after one release (twice): got %d, want 1", got)
	}
	if _, ok := c.Acquire("a"); !ok {
		t.Error("a refused after releasing one")
	}
	if _, ok := c.Acquire("b"); ok {
		t.Error("b acquired past its limit: a's release freed b's slot")
	}
}

func TestCounterNoLimit(t *testing.T) {
	c := NewCounter[int](0, nil, "test")
	for i := range 10000 {
		if _, ok := c.Acquire(1); !ok {
			t.Fatalf("acquire #%d refused with no limit", i)
		}
	}
	if got := c.Held(1); got != 10000 {
		t.Errorf("held: got %d, want 10000", got)
	}
}

func TestRate(t *testing.T) {
	now := time.Unix(1000, 0)
	r := NewRate[string](10, 5, nil, "test")
	r.now = func() time.Time { return now }
	allowed := func(k string, n int) int {
		got := 0
		for range n {
			if r.Allow(k) {
				got++
			}
		}
		return got
	}
	for _, tt := range []struct {
		name    string
		advance time.Duration
		key     string
		tries   int
		want    int
	}{
		{"burst", 0, "a", 20, 5},
		{"other key has its own bucket", 0, "b", 20, 5},
		{"no time passed", 0, "a", 5, 0},
		{"half a second refills five", 500 * time.Millisecond, "a", 20, 5},
		{"a long pause refills only the burst", time.Hour, "a", 20, 5},
		{"a tenth of a second is one", 100 * time.Millisecond, "a", 20, 1},
	} {
		now = now.Add(tt.advance)
		if got := allowed(tt.key, tt.tries); got != tt.want {
			t.Errorf("%s: got %d allowed of %d, want %d", tt.name, got, tt.tries, tt.want)
		}
	}
	if got := r.Refused(); got != 15+15+5+15+15+19 {
		t.Errorf("refused: got %d, want %d", got, 15+15+5+15+15+19)
	}
}

func TestRateSweepsFullBuckets(t *testing.T) {
	now := time.Unix(1000, 0)
	r := NewRate[int](1, 1, nil, "test")
	r.now = func() time.Time { return now }
	for i := range maxIdleBuckets {
		r.Allow(i)
	}
	now = now.Add(2 * time.Second) // every bucket full again
	r.Allow(-1)
	if got := len(r.buckets); got != 1 {
		t.Errorf("buckets after a sweep: got %d, want 1", got)
	}
}

// fakeListener returns its errors in turn, then a connection, then
// net.ErrClosed.
type fakeListener struct {
	net.Listener
	errs []error
	conn net.Conn
}

func (l *fakeListener) Accept() (net.Conn, error) {
	if len(l.errs) > 0 {
		err := l.errs[0]
		l.errs = l.errs[1:]
		return nil, err
	}
	if l.conn != nil {
		c := l.conn
		l.conn = nil
		return c, nil
	}
	return nil, net.ErrClosed
}

func TestAcceptBacksOffAndRecovers(t *testing.T) {
	emfile := &net.OpError{Op: "accept", Err: syscall.EMFILE}
	enfile := &net.OpError{Op: "accept", Err: syscall.ENFILE}
	other := errors.New("something odd")
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	var slept []time.Duration
	bo := &Backoff{Min: time.Millisecond, Max: 8 * time.Millisecond, Sleep: func(d time.Duration) { slept = append(slept, d) }}
	ln := &fakeListener{errs: []error{emfile, emfile, enfile, other, emfile, emfile}, conn: a}
	c, err := Accept(ln, bo)
	if err != nil || c != a {
		t.Fatalf("accept after errors: got %v, %v, want the connection", c, err)
	}
	want := []time.Duration{1, 2, 4, 8, 8, 8}
	for i := range want {
		want[i] *= time.Millisecond
	}
	if !slices.Equal(slept, want) {
		t.Errorf("sleeps: got %v, want %v", slept, want)
	}
	// A success starts over at Min.
	slept = nil
	ln.errs, ln.conn = []error{emfile}, b
	if c, err := Accept(ln, bo); err != nil || c != b {
		t.Fatalf("second accept: got %v, %v", c, err)
	}
	if !slices.Equal(slept, []time.Duration{time.Millisecond}) {
		t.Errorf("sleeps after a success: got %v, want [1ms]", slept)
	}
	// A closed listener ends the loop without sleeping.
	slept = nil
	if _, err := Accept(ln, bo); !errors.Is(err, net.ErrClosed) {
		t.Errorf("accept on a closed listener: got %v, want net.ErrClosed", err)
	}
	if len(slept) != 0 {
		t.Errorf("slept %v before returning on a closed listener", slept)
	}
}
