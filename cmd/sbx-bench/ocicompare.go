package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/sbxdev/sbx/internal/runtime/oci"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// compareOCIRuntimes is the second half of `-only create` when both runc
// and crun are installed (issue 13): a daemon on each, in this process,
// and the two runtimes' own `run` of /bin/true on a trivial bundle, all
// taking turns, so every ratio compares figures of one run: cold
// create→ready one at a time, then creates/s and destroys/s from
// scaleClients clients, and `runc run`/`crun run` throughput at that
// concurrency just before and after.
func compareOCIRuntimes(n int, agentPath string) error {
	runcBin, rerr := exec.LookPath("runc")
	crunBin, cerr := exec.LookPath("crun")
	if rerr != nil || cerr != nil {
		fmt.Println("runc vs crun: skipped (both must be installed)")
		return nil
	}
	agentPath, tmp, err := benchSetup(agentPath)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bundle, err := trivialBundle(filepath.Join(tmp, "bundle"))
	if err != nil {
		return err
	}
	ctx := context.Background()
	type side struct {
		name string
		bin  string
		c    *sbx.Client
		run  func(bundle string) func() error
	}
	sides := []*side{{name: "runc", bin: runcBin}, {name: "crun", bin: crunBin}}
	for _, s := range sides {
		c, stop, err := startDaemon(filepath.Join(tmp, s.name, "data"), agentPath, s.bin, 0)
		if err != nil {
			return fmt.Errorf("daemon on %s: %w", s.name, err)
		}
		defer stop()
		v, err := c.Version(ctx)
		if err != nil {
			return err
		}
		for _, r := range v.GetRuntimes() {
			if r.GetName() == "oci" {
				fmt.Printf("daemon on %s: healthy=%v: %s\n", s.name, r.GetHealthy(), r.GetHealthDetail())
				if !r.GetHealthy() {
					return fmt.Errorf("oci runtime on %s is unhealthy: %s", s.name, r.GetHealthDetail())
				}
			}
		}
		s.c = c
		if s.run, err = runtimeRunner(s.bin, filepath.Join(tmp, s.name, "root")); err != nil {
			return err
		}
	}
	var mu sync.Mutex
	var boxes []*sbx.Sandbox
	create := func(c *sbx.Client) func() error {
		return func() error {
			sb, err := c.Create(ctx, sbx.CreateOptions{})
			if err == nil {
				mu.Lock()
				boxes = append(boxes, sb)
				mu.Unlock()
			}
			return err
		}
	}
	destroyAll := func() (float64, error) {
		mu.Lock()
		bs := boxes
		boxes = nil
		mu.Unlock()
		if len(bs) == 0 {
			return 0, nil
		}
		wall, failed, err := concurrently(len(bs), func(i int) error { return bs[i].Destroy(ctx) })
		if failed > 0 {
			return 0, fmt.Errorf("destroys: %d of %d failed, first: %w", failed, len(bs), err)
		}
		return rate(len(bs), wall), nil
	}
	defer destroyAll() //nolint:errcheck

	// Warm both up, then one at a time, taking turns.
	for _, s := range sides {
		if err := create(s.c)(); err != nil {
			return err
		}
	}
	rs, err := measureTogether(n,
		task{"runc run /bin/true", sides[0].run(bundle)},
		task{"crun run /bin/true", sides[1].run(bundle)},
		task{"create→ready, daemon on runc", create(sides[0].c)},
		task{"create→ready, daemon on crun", create(sides[1].c)},
	)
	if err != nil {
		return err
	}
	if _, err := destroyAll(); err != nil {
		return err
	}
	printResults(rs...)

	// Throughput from scaleClients clients, taking turns by phase in the
	// order runc, crun, crun, runc (a daemon's background work after a
	// phase, such as deleting veths and refilling its namespace pool,
	// lands on the next phase: each side gets it once before and once
	// after its own).
	const runs, creates = 64, 24
	throughput := func(f func() error, k int) (time.Duration, error) {
		wall, failed, err := concurrently(k, func(int) error { return f() })
		if failed > 0 {
			return 0, fmt.Errorf("%d of %d failed, first: %w", failed, k, err)
		}
		return wall, nil
	}
	var runBefore, runAfter, createRate, destroyRate [2]float64
	for i, s := range sides {
		wall, err := throughput(s.run(bundle), runs)
		if err != nil {
			return fmt.Errorf("%s run: %w", s.name, err)
		}
		runBefore[i] = rate(runs, wall)
	}
	var createWall [2]time.Duration
	var destroys [2]float64
	for _, i := range []int{0, 1, 1, 0} {
		wall, err := throughput(create(sides[i].c), creates)
		if err != nil {
			return fmt.Errorf("creates on %s: %w", sides[i].name, err)
		}
		createWall[i] += wall
		r, err := destroyAll()
		if err != nil {
			return fmt.Errorf("on %s: %w", sides[i].name, err)
		}
		destroys[i] += r / 2
	}
	for i := range sides {
		createRate[i], destroyRate[i] = rate(2*creates, createWall[i]), destroys[i]
	}
	for i, s := range sides {
		wall, err := throughput(s.run(bundle), runs)
		if err != nil {
			return fmt.Errorf("%s run: %w", s.name, err)
		}
		runAfter[i] = rate(runs, wall)
	}
	fmt.Printf("cold create→ready p50, runc / crun  = %s / %s  (%.2fx; runc run true %s, crun run true %s; %.2fx and %.2fx their runtime's run)\n",
		ms(rs[2].p(0.5)), ms(rs[3].p(0.5)), ratio(rs[3], rs[2]), ms(rs[0].p(0.5)), ms(rs[1].p(0.5)), ratio(rs[2], rs[0]), ratio(rs[3], rs[1]))
	for i, s := range sides {
		base := (runBefore[i] + runAfter[i]) / 2
		fmt.Printf("creates/s, %d clients, cold, %s   = %6.1f  (%s run /bin/true at %d clients: %.1f/s before, %.1f/s after; %.2fx); destroys/s %.1f\n",
			scaleClients, s.name, createRate[i], s.name, scaleClients, runBefore[i], runAfter[i], createRate[i]/base, destroyRate[i])
	}
	fmt.Printf("crun / runc creates/s               = %.2fx  (crun run / runc run: %.2fx)\n",
		createRate[1]/createRate[0], (runBefore[1]+runAfter[1])/(runBefore[0]+runAfter[0]))
	return nil
}

// runtimeRunner returns a function making tasks that run a bundle with the
// OCI runtime at bin in the foreground, each under a new container id, as
// the oci driver runs that runtime on this host (oci.RuntimeRunner: crun
// on a hybrid cgroup host runs without the cgroup2 mount).
func runtimeRunner(bin, root string) (func(bundle string) func() error, error) {
	runCmd, err := oci.RuntimeRunner(bin)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", bin, err)
	}
	var mu sync.Mutex
	i := 0
	return func(bundle string) func() error {
		return func() error {
			mu.Lock()
			i++
			id := fmt.Sprintf("bench-%d", i)
			mu.Unlock()
			cmd := exec.Command(bin, "--root", root, "run", "--bundle", bundle, id)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := runCmd(cmd); err != nil {
				return fmt.Errorf("%s run: %v: %s", filepath.Base(bin), err, out.String())
			}
			return nil
		}
	}, nil
}
