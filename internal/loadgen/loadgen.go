// Package loadgen drives a daemon with many concurrent clients making mixed
// API calls (create, exec, file write and read, list, get, destroy) and
// reports every call's latency and every error. sbx-bench (`-only load`) and
// the integration test TestLoad use it. It speaks to a daemon only through
// the Go SDK and imports nothing else of sbx.
package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// Config says how hard to push.
type Config struct {
	// Clients run concurrently, each with its own SDK client.
	Clients int
	// Duration is how long clients start new calls; the calls under way
	// then finish and every sandbox made is destroyed.
	Duration time.Duration
	// MaxBoxesPerClient bounds each client's live sandboxes (default 2).
	MaxBoxesPerClient int
	// Seed makes the mix of calls repeatable (per client).
	Seed uint64
	// Create, if set, is used for creates (labels are added).
	Create sbx.CreateOptions
	// OnCreate is told every sandbox made (for leak checks).
	OnCreate func(id string)
}

// Op is one kind of call.
type Op string

// The calls; OpMissing asks for a sandbox that does not exist, an error on
// purpose (it must be NotFound).
const (
	OpCreate  Op = "create"
	OpExec    Op = "exec"
	OpWrite   Op = "write"
	OpRead    Op = "read"
	OpList    Op = "list"
	OpGet     Op = "get"
	OpMissing Op = "get-missing"
	OpDestroy Op = "destroy"
)

// Stat is what one kind of call did.
type Stat struct {
	Op        Op
	Calls     int
	Errors    int
	Durations []time.Duration // of calls without error
}

// P returns the q-quantile of the successful calls' latencies.
func (s *Stat) P(q float64) time.Duration {
	if len(s.Durations) == 0 {
		return 0
	}
	d := append([]time.Duration(nil), s.Durations...)
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[int(q*float64(len(d)-1))]
}

// Report is the outcome of a run.
type Report struct {
	Stats map[Op]*Stat
	// Errors are the unexpected errors (at most 50 kept), Unexpected their count.
	Errors     []string
	Unexpected int
	Elapsed    time.Duration
}

// String formats a table: calls, errors, p50 and p99 per call.
func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-12s %8s %7s %10s %10s\n", "call", "calls", "errors", "p50", "p99")
	ops := []Op{OpCreate, OpExec, OpWrite, OpRead, OpList, OpGet, OpMissing, OpDestroy}
	total := 0
	for _, op := range ops {
		s := r.Stats[op]
		if s == nil {
			continue
		}
		total += s.Calls
		fmt.Fprintf(&b, "%-12s %8d %7d %10s %10s\n", op, s.Calls, s.Errors, ms(s.P(0.5)), ms(s.P(0.99)))
	}
	fmt.Fprintf(&b, "%d calls in %s (%.0f/s), %d unexpected errors", total, r.Elapsed.Round(time.Millisecond),
		float64(total)/r.Elapsed.Seconds(), r.Unexpected)
	for _, e := range r.Errors {
		fmt.Fprintf(&b, "\n  %s", e)
	}
	return b.String()
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/1e6) }

type recorder struct {
	mu  sync.Mutex
	rep *Report
}

func (r *recorder) record(op Op, d time.Duration, err error, deliberate bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.rep.Stats[op]
	if s == nil {
		s = &Stat{Op: op}
		r.rep.Stats[op] = s
	}
	s.Calls++
	switch {
	case err == nil && !deliberate:
		s.Durations = append(s.Durations, d)
	case err == nil && deliberate:
		s.Errors++
		r.rep.Unexpected++
		r.keep(fmt.Sprintf("%s: succeeded, want an error", op))
	case deliberate && !errors.Is(err, errNotNotFound):
		s.Durations = append(s.Durations, d)
	default:
		s.Errors++
		r.rep.Unexpected++
		r.keep(fmt.Sprintf("%s: %v", op, err))
	}
}

func (r *recorder) keep(msg string) {
	if len(r.rep.Errors) < 50 {
		r.rep.Errors = append(r.rep.Errors, msg)
	}
}

// Run drives addr's daemon as cfg says; newClient makes each client's SDK
// client. It returns when every client has stopped and cleaned up.
func Run(ctx context.Context, cfg Config, newClient func() *sbx.Client) *Report {
	if cfg.MaxBoxesPerClient == 0 {
		cfg.MaxBoxesPerClient = 2
	}
	rec := &recorder{rep: &Report{Stats: map[Op]*Stat{}}}
	t0 := time.Now()
	deadline := t0.Add(cfg.Duration)
	var wg sync.WaitGroup
	for i := range cfg.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := newClient()
			defer c.Close()
			cl := &client{c: c, cfg: &cfg, rec: rec, id: i, rng: rand.New(rand.NewPCG(cfg.Seed, uint64(i)))}
			for time.Now().Before(deadline) && ctx.Err() == nil {
				cl.step(ctx)
			}
			cl.cleanup(ctx)
		}()
	}
	wg.Wait()
	rec.rep.Elapsed = time.Since(t0)
	return rec.rep
}

type client struct {
	c     *sbx.Client
	cfg   *Config
	rec   *recorder
	id, n int
	rng   *rand.Rand
	boxes []*box
}

type box struct {
	sb    *sbx.Sandbox
	files map[string][]byte
}

// call times f (bounded to a minute) and records it.
func (cl *client) call(ctx context.Context, op Op, deliberate bool, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	t0 := time.Now()
	err := f(ctx)
	cl.rec.record(op, time.Since(t0), err, deliberate)
	return err
}

func (cl *client) pick() *box {
	if len(cl.boxes) == 0 {
		return nil
	}
	return cl.boxes[cl.rng.IntN(len(cl.boxes))]
}

func (cl *client) step(ctx context.Context) {
	cl.n++
	r := cl.rng.IntN(100)
	b := cl.pick()
	switch {
	case b == nil || (r < 10 && len(cl.boxes) < cl.cfg.MaxBoxesPerClient):
		cl.create(ctx)
	case r < 16:
		cl.destroy(ctx, b)
	case r < 46:
		_ = cl.call(ctx, OpExec, false, func(ctx context.Context) error {
			res, err := b.sb.Run(ctx, "sh", "-c", "echo $((6*7))")
			if err == nil && (string(res.Stdout) != "42\n" || res.Code != 0) {
				err = fmt.Errorf("exec in %s: got %q (exit %d, signal %d, oom_killed %v, pids_limit_hit %v, error %q, stderr %q), want \"42\\n\" and exit 0",
					b.sb.ID, res.Stdout, res.Code, res.Signal, res.OOMKilled, res.PidsLimitHit, res.Error, res.Stderr)
			}
			return err
		})
	case r < 64:
		p := fmt.Sprintf("/tmp/load-%d-%d", cl.id, cl.n)
		data := make([]byte, 1+cl.rng.IntN(32<<10))
		for i := range data {
			data[i] = byte(cl.rng.Uint32())
		}
		if cl.call(ctx, OpWrite, false, func(ctx context.Context) error { return b.sb.WriteFile(ctx, p, data, 0o644) }) == nil {
			b.files[p] = data
		}
	case r < 80 && len(b.files) > 0:
		var p string
		for p = range b.files {
			break
		}
		_ = cl.call(ctx, OpRead, false, func(ctx context.Context) error {
			got, err := b.sb.ReadFile(ctx, p)
			if err == nil && !bytes.Equal(got, b.files[p]) {
				err = fmt.Errorf("read %s in %s: %d bytes differ from the %d written", p, b.sb.ID, len(got), len(b.files[p]))
			}
			return err
		})
	case r < 88:
		_ = cl.call(ctx, OpList, false, func(ctx context.Context) error {
			_, err := cl.c.List(ctx, fmt.Sprintf("loadgen-client=%d", cl.id))
			return err
		})
	case r < 95:
		_ = cl.call(ctx, OpGet, false, func(ctx context.Context) error {
			_, err := cl.c.Get(ctx, b.sb.ID)
			return err
		})
	default:
		_ = cl.call(ctx, OpMissing, true, func(ctx context.Context) error {
			_, err := cl.c.Get(ctx, fmt.Sprintf("sb-missing-%d-%d", cl.id, cl.n))
			if err != nil && !sbx.IsNotFound(err) {
				return errors.Join(errNotNotFound, err)
			}
			return err
		})
	}
}

var errNotNotFound = errors.New("want NotFound")

func (cl *client) create(ctx context.Context) {
	opts := cl.cfg.Create
	opts.Labels = map[string]string{"loadgen-client": fmt.Sprint(cl.id)}
	for k, v := range cl.cfg.Create.Labels {
		opts.Labels[k] = v
	}
	var sb *sbx.Sandbox
	err := cl.call(ctx, OpCreate, false, func(ctx context.Context) error {
		var err error
		sb, err = cl.c.Create(ctx, opts)
		return err
	})
	if err != nil {
		return
	}
	if cl.cfg.OnCreate != nil {
		cl.cfg.OnCreate(sb.ID)
	}
	cl.boxes = append(cl.boxes, &box{sb: sb, files: map[string][]byte{}})
}

func (cl *client) destroy(ctx context.Context, b *box) {
	_ = cl.call(ctx, OpDestroy, false, func(ctx context.Context) error { return b.sb.Destroy(ctx) })
	for i, o := range cl.boxes {
		if o == b {
			cl.boxes = append(cl.boxes[:i], cl.boxes[i+1:]...)
			break
		}
	}
}

func (cl *client) cleanup(ctx context.Context) {
	for len(cl.boxes) > 0 {
		cl.destroy(ctx, cl.boxes[0])
	}
}
