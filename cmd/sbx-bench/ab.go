package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// runAB compares two builds of sbx in one run: the daemon and agent next
// to agentPath (the new build) and those in baseDir (the old one, e.g.
// main's `make build` in a checkout of its own). Each runs as a daemon
// process of its own, on data dirs of their own, and every measurement
// takes turns between them, so that the machine's other load weighs on
// both alike:
//   - `exec true` through the Go SDK (the exec upgrade), one sample of
//     each per round;
//   - the daemon's CPU seconds per GiB of stdout relayed to an SDK client
//     (less sensitive to other load than latencies);
//   - with rounds > 0, a neighbour's `exec true` at rest and while all six
//     bombs run (see neighbours.go), each daemon in turn, rounds times.
//
// With o.benchShares the bench and both daemons run in a cpu group of
// those shares, and o.boxesShares is both daemons' --boxes-cpu-shares (see
// neighbourOpts); o.bombs, if given, names the bombs the neighbour rounds
// run (all six otherwise).
func runAB(n int, agentPath, baseDir string, rounds int, o neighbourOpts) error {
	if baseDir == "" {
		return fmt.Errorf("-only ab needs -baseline DIR (a directory holding the old build's sbx and sbx-agent)")
	}
	fmt.Printf("load average at start: %s", loadAvg())
	if o.benchShares > 0 {
		undo, err := cpuGroup(o.benchShares)
		if err != nil {
			return err
		}
		defer undo()
	}
	var extra []string
	if o.boxesShares > 0 {
		extra = append(extra, "--boxes-cpu-shares", strconv.FormatUint(o.boxesShares, 10))
	}
	agentPath, tmp, err := benchSetup(agentPath)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	baseDir, err = filepath.Abs(baseDir)
	if err != nil {
		return err
	}
	type side struct {
		name string
		d    *daemonProc
		sb   *sbx.Sandbox
	}
	var sides []*side
	defer func() {
		for _, s := range sides {
			if s.sb != nil {
				_ = s.sb.Destroy(context.Background())
			}
			s.d.stop()
		}
	}()
	ctx := context.Background()
	for _, b := range []struct{ name, dir string }{{"old", baseDir}, {"new", filepath.Dir(agentPath)}} {
		d, err := startDaemonProc(filepath.Join(b.dir, "sbx"), filepath.Join(tmp, b.name), extra...)
		if err != nil {
			return fmt.Errorf("%s daemon: %w", b.name, err)
		}
		s := &side{name: b.name, d: d}
		sides = append(sides, s)
		if s.sb, err = d.c.Create(ctx, sbx.CreateOptions{Timeout: time.Hour}); err != nil {
			return fmt.Errorf("%s daemon: create: %w", b.name, err)
		}
	}
	execTrue := func(sb *sbx.Sandbox) func() error {
		return func() error {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			res, err := sb.Run(ctx, "true")
			if err == nil && res.Code != 0 {
				err = fmt.Errorf("exit %d", res.Code)
			}
			return err
		}
	}
	// Warm both up (first connections, the agents' first forks).
	for _, s := range sides {
		for range 5 {
			if err := execTrue(s.sb)(); err != nil {
				return fmt.Errorf("%s: warm-up: %w", s.name, err)
			}
		}
	}
	rs, err := measureTogether(n*5, task{"old: exec true (SDK)", execTrue(sides[0].sb)}, task{"new: exec true (SDK)", execTrue(sides[1].sb)})
	if err != nil {
		return err
	}
	fmt.Printf("%-34s %10s %10s\n", "", "p50", "p99")
	for _, r := range rs {
		fmt.Printf("%-34s %s %s\n", r.name, ms(r.p(0.5)), ms(r.p(0.99)))
	}
	fmt.Printf("new / old exec true: p50 %.2fx, p99 %.2fx\n",
		float64(rs[1].p(0.5))/float64(rs[0].p(0.5)), float64(rs[1].p(0.99))/float64(rs[0].p(0.99)))

	// Daemon CPU per GiB relayed, taking turns, three times each.
	const relay = 1 << 30
	cpuPerGiB := map[string][]float64{}
	for range 3 {
		for _, s := range sides {
			cpu0, err := processCPU(s.d.cmd.Process.Pid)
			if err != nil {
				return err
			}
			var got countWriter
			st, err := s.sb.Exec(ctx, sbx.ExecOptions{Shell: fmt.Sprintf("head -c %d /dev/zero", relay), Stdout: &got})
			if err != nil || st.Code != 0 {
				return fmt.Errorf("%s: relay: %v %v", s.name, st, err)
			}
			cpu1, err := processCPU(s.d.cmd.Process.Pid)
			if err != nil {
				return err
			}
			cpuPerGiB[s.name] = append(cpuPerGiB[s.name], (cpu1-cpu0).Seconds()/(float64(got.n)/(1<<30)))
		}
	}
	for _, s := range sides {
		fmt.Printf("%s: daemon CPU per GiB relayed to the SDK: %.2f s (runs: %.2f)\n", s.name, median(cpuPerGiB[s.name]), cpuPerGiB[s.name])
	}
	fmt.Printf("new / old daemon CPU per GiB: %.2fx\n", median(cpuPerGiB["new"])/median(cpuPerGiB["old"]))

	if rounds <= 0 {
		return nil
	}
	// Neighbours: each daemon's at-rest and all-bombs samples, pooled over
	// rounds, the two daemons taking turns. Only one daemon's bombs run at
	// a time.
	var which []int
	for i, b := range bombs {
		if len(o.bombs) == 0 || slices.Contains(o.bombs, b.name) {
			which = append(which, i)
		}
	}
	if len(which) == 0 {
		return fmt.Errorf("-bombs %q names no bomb (have fork, memory, disk, fds, stdout, cpu)", strings.Join(o.bombs, ","))
	}
	fmt.Printf("bombs: %d of %d\n", len(which), len(bombs))
	rest := map[string]*result{"old": {}, "new": {}}
	busy := map[string]*result{"old": {}, "new": {}}
	for i := range rounds {
		// Alternate which goes first: the one after the other's bombs
		// meets their teardown.
		order := sides
		if i%2 == 1 {
			order = []*side{sides[1], sides[0]}
		}
		for _, s := range order {
			r, err := measure("rest", n, execTrue(s.sb))
			if err != nil {
				return err
			}
			b, err := underBombs(ctx, s.d.c, which, n, execTrue(s.sb))
			if err != nil {
				return err
			}
			fmt.Printf("round %d %s: rest p50 %s p99 %s, all bombs p50 %s p99 %s (%.2fx), load %s", i+1, s.name,
				ms(r.p(0.5)), ms(r.p(0.99)), ms(b.p(0.5)), ms(b.p(0.99)), float64(b.p(0.99))/float64(r.p(0.99)), loadAvg())
			rest[s.name].ds = append(rest[s.name].ds, r.ds...)
			busy[s.name].ds = append(busy[s.name].ds, b.ds...)
			busy[s.name].failed += b.failed
		}
	}
	fmt.Printf("%-10s %10s %10s %10s %10s %8s %8s\n", "neighbour", "rest p50", "rest p99", "bombs p50", "bombs p99", "p50 ×", "p99 ×")
	for _, s := range sides {
		r, b := rest[s.name], busy[s.name]
		fmt.Printf("%-10s %s %s %s %s %7.2fx %7.2fx", s.name, ms(r.p(0.5)), ms(r.p(0.99)), ms(b.p(0.5)), ms(b.p(0.99)),
			float64(b.p(0.5))/float64(r.p(0.5)), float64(b.p(0.99))/float64(r.p(0.99)))
		if b.failed > 0 {
			fmt.Printf("  %d FAILED", b.failed)
		}
		fmt.Println()
	}
	return nil
}

// median is the middle of xs (the upper one of an even count).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s[len(s)/2]
}
