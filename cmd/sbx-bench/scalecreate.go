package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// The create-path measurements of `sbx-bench -only scale` (issue 13): cold
// creates one at a time taking turns with `runc run` of a trivial bundle
// (so the machine's drift lands on both sides of the ratio), where each
// create's time went (the daemon's "create phases" and the oci driver's
// "box created" debug lines), and warm creates sustained over
// -scale-sustain by scaleClients clients, each creating and destroying in
// a loop, beside `runc run` throughput at the same concurrency measured
// just before and after.

// scaleOpts are the knobs of the scale run.
type scaleOpts struct {
	// sustain is how long the sustained warm creates run.
	sustain time.Duration
	// coldRounds is how many cold creates take turns with `runc run`.
	coldRounds int
}

// coldResult is cold creates one at a time beside `runc run`.
type coldResult struct {
	create, runc result
}

// coldVsRunc creates rounds sandboxes on d one at a time, taking turns with
// `runc run` of bundle, and destroys them afterwards.
func coldVsRunc(ctx context.Context, d *scaleDaemon, runtimeBin, bundle, runcRoot string, rounds int) (coldResult, error) {
	var r coldResult
	var boxes []*sbx.Sandbox
	defer func() {
		for _, b := range boxes {
			_ = b.Destroy(ctx)
		}
	}()
	runcRun := runcRunner(runtimeBin, runcRoot)
	rs, err := measureTogether(rounds,
		task{"runc run /bin/true", runcRun(bundle)},
		task{"sbx create→ready, cold", func() error {
			sb, err := d.c.Create(ctx, sbx.CreateOptions{Network: &sbx.NetworkPolicy{Mode: "public"}})
			if err == nil {
				boxes = append(boxes, sb)
			}
			return err
		}})
	if err != nil {
		return r, err
	}
	r.runc, r.create = rs[0], rs[1]
	return r, nil
}

// phaseLines are the timed lines a daemon at --log-level debug writes for
// each create: the manager's and the oci driver's.
var phaseLines = []struct{ title, msg string }{
	{"  create phases (daemon)", `msg="create phases"`},
	{"  in the driver (oci)", `msg="box created"`},
}

// phaseMedians reads the daemon log between byte offsets from and to and returns,
// for log lines carrying msg (and, if warm is not "", warm=<warm>), the
// median of each phase in the order first seen, and how many lines.
func phaseMedians(logPath string, from, to int64, msg, warm string) (names []string, p50 map[string]time.Duration, n int) {
	f, err := os.Open(logPath)
	if err != nil {
		return nil, nil, 0
	}
	defer f.Close()
	if _, err := f.Seek(from, 0); err != nil {
		return nil, nil, 0
	}
	all := map[string][]time.Duration{}
	sc := bufio.NewScanner(io.LimitReader(f, to-from))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.Contains(l, msg) || (warm != "" && !strings.Contains(l, " warm="+warm)) {
			continue
		}
		_, rest, ok := strings.Cut(l, `phases="`)
		if !ok {
			continue
		}
		rest, _, _ = strings.Cut(rest, `"`)
		n++
		for _, kv := range strings.Fields(rest) {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				continue
			}
			dur, err := time.ParseDuration(v)
			if err != nil {
				continue
			}
			if _, seen := all[k]; !seen {
				names = append(names, k)
			}
			all[k] = append(all[k], dur)
		}
	}
	p50 = map[string]time.Duration{}
	for k, ds := range all {
		slices.Sort(ds)
		p50[k] = ds[(len(ds)-1)/2]
	}
	return names, p50, n
}

// logSize is the daemon log's size: where the next measurement's lines begin.
func logSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// printPhases prints the median phases of the creates logged between
// offsets from and to (warm ones if warm is "true", cold if "false").
func printPhases(logPath string, from, to int64, warm string) {
	for _, pl := range phaseLines {
		w := warm
		if pl.msg == `msg="box created"` {
			w = "" // the driver's line says nothing of the pool
		}
		names, p50, n := phaseMedians(logPath, from, to, pl.msg, w)
		if n == 0 {
			continue
		}
		var b strings.Builder
		for _, k := range names {
			fmt.Fprintf(&b, " %s %.2f", k, float64(p50[k].Microseconds())/1000)
		}
		fmt.Printf("%-36s= p50 of %d, ms:%s\n", pl.title, n, b.String())
	}
}

// sustainedResult is warm creates sustained over a span.
type sustainedResult struct {
	creates, warm, failed int
	firstErr              error
	wall                  time.Duration
	create                result
	// runcBefore and runcAfter are `runc run` throughput at scaleClients
	// clients just before and after.
	runcBefore, runcAfter float64
	// crunBefore and crunAfter are the same for `crun run` (0: not
	// measured).
	crunBefore, crunAfter float64
}

// sustainedWarm runs scaleClients clients for span, each creating a
// sandbox (default policy: that of warm boxes) and destroying it, in a
// loop; the warm count comes from the daemon's log.
func sustainedWarm(ctx context.Context, d *scaleDaemon, span time.Duration) sustainedResult {
	var r sustainedResult
	r.create.name = "sustained create"
	before := warmCount(d.logPath)
	var mu sync.Mutex
	var creates atomic.Int64
	var wg sync.WaitGroup
	t0 := time.Now()
	end := t0.Add(span)
	for range scaleClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				c0 := time.Now()
				sb, err := d.c.Create(ctx, sbx.CreateOptions{})
				took := time.Since(c0)
				mu.Lock()
				if err != nil {
					r.failed++
					if r.firstErr == nil {
						r.firstErr = err
					}
				} else {
					r.create.ds = append(r.create.ds, took)
				}
				mu.Unlock()
				if err != nil {
					continue
				}
				creates.Add(1)
				if err := sb.Destroy(ctx); err != nil {
					mu.Lock()
					r.failed++
					if r.firstErr == nil {
						r.firstErr = fmt.Errorf("destroy: %w", err)
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	r.wall = time.Since(t0)
	r.creates = int(creates.Load())
	r.warm = warmCount(d.logPath) - before
	return r
}

// runcRoot is where the scale run's `runc run`s keep their state.
func runcRoot(tmp string) string { return filepath.Join(tmp, "runc-root") }
