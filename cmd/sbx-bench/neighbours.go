package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// bombs are what hostile neighbours run, each in a default sandbox. Each
// loops until its box is destroyed.
var bombs = []struct{ name, shell string }{
	{"fork", `bomb() { bomb | bomb & }; while :; do bomb 2>/dev/null; sleep 0.1; done`},
	{"memory", `while :; do python3 -c 'b = []
while True: b.append(bytearray(1 << 20))' 2>/dev/null; done`},
	{"disk", `while :; do dd if=/dev/zero of=/tmp/fill bs=1M 2>/dev/null; rm -f /tmp/fill; done`},
	{"fds", `while :; do python3 -c '
import os, resource
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
fds = []
try:
    while True: fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError: pass
import time; time.sleep(1)' 2>/dev/null; done`},
	{"stdout", `cat /dev/zero`},
	{"cpu", `while :; do :; done`},
}

// runNeighbours measures a neighbour sandbox's `exec true` at rest, while
// each bomb runs in a box of its own and while all run together, and the
// daemon's CPU per GB of relayed output. The daemon runs as its own process
// (bin/sbx next to the agent) so that its CPU time is its own. The
// neighbour is measured at rest again at the end, and the host's load
// average printed, so that a change in the machine's other load shows.
// With rounds > 0 it alternates rounds of at rest and all bombs together
// instead (see neighbourRounds).
func runNeighbours(n int, agentPath, _ string, o neighbourOpts) error {
	fmt.Printf("load average at start: %s", loadAvg())
	rounds := o.rounds
	if o.benchShares > 0 {
		undo, err := cpuGroup(o.benchShares)
		if err != nil {
			return err
		}
		defer undo()
	}
	agentPath, tmp, err := benchSetup(agentPath)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var extra []string
	if o.boxesShares > 0 {
		extra = append(extra, "--boxes-cpu-shares", strconv.FormatUint(o.boxesShares, 10))
	}
	c, pid, stop, err := startDaemonProcess(filepath.Join(filepath.Dir(agentPath), "sbx"), filepath.Join(tmp, "data"), extra...)
	if err != nil {
		return err
	}
	defer stop()
	ctx := context.Background()
	nb, err := c.Create(ctx, sbx.CreateOptions{Timeout: time.Hour})
	if err != nil {
		return err
	}
	defer nb.Destroy(ctx) //nolint:errcheck
	execTrue := func() error {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		res, err := nb.Run(ctx, "true")
		if err == nil && res.Code != 0 {
			err = fmt.Errorf("exit %d", res.Code)
		}
		return err
	}
	samples := n * 5
	if rounds > 0 {
		return neighbourRounds(ctx, c, rounds, samples, execTrue)
	}
	rest, err := measure("neighbour exec true, at rest", samples, execTrue)
	if err != nil {
		return err
	}
	results := []result{rest}
	for _, b := range bombs {
		r, err := underBombs(ctx, c, []int{indexOf(b.name)}, samples, execTrue)
		if err != nil {
			return err
		}
		r.name = "  while the " + b.name + " bomb runs"
		results = append(results, r)
	}
	all := make([]int, len(bombs))
	for i := range all {
		all[i] = i
	}
	r, err := underBombs(ctx, c, all, samples, execTrue)
	if err != nil {
		return err
	}
	r.name = "  while all six run"
	results = append(results, r)
	after, err := measure("  at rest again, after the bombs", samples, execTrue)
	if err != nil {
		return err
	}
	results = append(results, after)
	fmt.Printf("%-44s %10s %10s %8s %8s\n", "neighbour `exec true`", "p50", "p99", "p50 ×", "p99 ×")
	for _, r := range results {
		fmt.Printf("%-44s %s %s %7.2fx %7.2fx", r.name, ms(r.p(0.5)), ms(r.p(0.99)),
			float64(r.p(0.5))/float64(rest.p(0.5)), float64(r.p(0.99))/float64(rest.p(0.99)))
		if r.failed > 0 {
			fmt.Printf("  %d of %d FAILED, first: %v", r.failed, samples, r.firstErr)
		}
		fmt.Println()
	}
	fmt.Printf("p99 under all bombs / at rest = %.2fx  (aim ≤ 5x)\n", float64(r.p(0.99))/float64(rest.p(0.99)))
	fmt.Printf("load average after the bombs: %s", loadAvg())

	// Daemon CPU per GB relayed: 1 GiB of output through the API, read and
	// dropped by the client.
	const relay = 1 << 30
	cpu0, err := processCPU(pid)
	if err != nil {
		return err
	}
	t0 := time.Now()
	var got countWriter
	st, err := nb.Exec(ctx, sbx.ExecOptions{Shell: fmt.Sprintf("head -c %d /dev/zero", relay), Stdout: &got})
	if err != nil || st.Code != 0 {
		return fmt.Errorf("relay: %v %v", st, err)
	}
	wall := time.Since(t0)
	cpu1, _ := processCPU(pid)
	gb := float64(got.n) / (1 << 30)
	fmt.Printf("daemon CPU per GiB relayed          = %6.2f s  (%.2f GiB in %.1f s, %.0f MiB/s)\n",
		(cpu1-cpu0).Seconds()/gb, gb, wall.Seconds(), float64(got.n)/(1<<20)/wall.Seconds())
	return nil
}

// neighbourRounds measures f at rest and under all bombs together,
// alternately, rounds times, and compares the pooled samples: other load
// on the machine then weighs on both about equally.
func neighbourRounds(ctx context.Context, c *sbx.Client, rounds, n int, f func() error) error {
	all := make([]int, len(bombs))
	for i := range all {
		all[i] = i
	}
	rest, busy := result{name: "neighbour exec true, at rest (pooled)"}, result{name: "  while all six run (pooled)"}
	fmt.Printf("%-44s %10s %10s %10s %10s %8s\n", "round", "rest p50", "rest p99", "bombs p50", "bombs p99", "p99 ×")
	for i := range rounds {
		r, err := measure("rest", n, f)
		if err != nil {
			return err
		}
		b, err := underBombs(ctx, c, all, n, f)
		if err != nil {
			return err
		}
		fmt.Printf("%-44d %s %s %s %s %7.2fx  load %s", i+1, ms(r.p(0.5)), ms(r.p(0.99)), ms(b.p(0.5)), ms(b.p(0.99)),
			float64(b.p(0.99))/float64(r.p(0.99)), loadAvg())
		rest.ds, busy.ds = append(rest.ds, r.ds...), append(busy.ds, b.ds...)
		busy.failed += b.failed
		if busy.firstErr == nil {
			busy.firstErr = b.firstErr
		}
	}
	for _, r := range []result{rest, busy} {
		fmt.Printf("%-44s %s %s\n", r.name, ms(r.p(0.5)), ms(r.p(0.99)))
	}
	if busy.failed > 0 {
		fmt.Printf("%d execs FAILED under the bombs, first: %v\n", busy.failed, busy.firstErr)
	}
	fmt.Printf("pooled p99 under all bombs / at rest = %.2fx, p50 %.2fx  (aim: p99 ≤ 5x)\n",
		float64(busy.p(0.99))/float64(rest.p(0.99)), float64(busy.p(0.5))/float64(rest.p(0.5)))
	return nil
}

// neighbourOpts are the neighbours measurement's own flags.
type neighbourOpts struct {
	rounds      int
	boxesShares uint64   // the daemon's --boxes-cpu-shares
	benchShares uint64   // cpu.shares of a cgroup the bench and its daemon run in
	bombs       []string // -only ab: the bombs its neighbour rounds run; all if empty
}

// cpuGroup moves this process (and so the daemon it starts) into a new
// cgroup v1 cpu group with these shares, and returns how to move back and
// remove it.
func cpuGroup(shares uint64) (func(), error) {
	root := "/sys/fs/cgroup/cpu"
	dir := filepath.Join(root, fmt.Sprintf("sbx-bench-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("-bench-cpu-shares needs the cgroup v1 cpu hierarchy: %w", err)
	}
	move := func(to string) error {
		return os.WriteFile(filepath.Join(to, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0)
	}
	err := os.WriteFile(filepath.Join(dir, "cpu.shares"), []byte(strconv.FormatUint(shares, 10)), 0)
	if err == nil {
		err = move(dir)
	}
	if err != nil {
		_ = os.Remove(dir)
		return nil, fmt.Errorf("bench cpu group: %w", err)
	}
	return func() {
		_ = move(root)
		_ = os.Remove(dir)
	}, nil
}

// loadAvg is /proc/loadavg's line.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return err.Error() + "\n"
	}
	return string(b)
}

func indexOf(name string) int {
	for i, b := range bombs {
		if b.name == name {
			return i
		}
	}
	panic("no bomb " + name)
}

// underBombs starts the bombs with these indexes, each in a default box,
// measures f while they run, and destroys the boxes.
func underBombs(ctx context.Context, c *sbx.Client, which []int, n int, f func() error) (result, error) {
	var boxes []*sbx.Sandbox
	defer func() {
		for _, b := range boxes {
			_ = b.Destroy(context.Background())
		}
	}()
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for _, i := range which {
		sb, err := c.Create(ctx, sbx.CreateOptions{Timeout: time.Hour})
		if err != nil {
			return result{}, fmt.Errorf("create %s bomb box: %w", bombs[i].name, err)
		}
		boxes = append(boxes, sb)
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The output flood is read and dropped as fast as it comes.
			_, _ = sb.Exec(bctx, sbx.ExecOptions{Shell: bombs[i].shell, Stdout: io.Discard, Stderr: io.Discard})
		}()
	}
	// Let the bombs reach their limits before measuring.
	time.Sleep(2 * time.Second)
	// A failed exec is a finding, not the end of the run: count it.
	r := result{}
	for range n {
		t0 := time.Now()
		if err := f(); err != nil {
			r.failed++
			if r.firstErr == nil {
				r.firstErr = err
			}
			continue
		}
		r.ds = append(r.ds, time.Since(t0))
	}
	return r, nil
}

type countWriter struct{ n int64 }

func (w *countWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

// processCPU is a process's user+system CPU time so far.
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * (time.Second / 100), nil // USER_HZ
}

// startDaemonProcess runs `sbx serve` as a child (no warm pool, networking
// off, then args) and returns a client, its pid and a stop function.
func startDaemonProcess(sbxBin, dataDir string, args ...string) (*sbx.Client, int, func(), error) {
	d, err := startDaemonProc(sbxBin, dataDir, args...)
	if err != nil {
		return nil, 0, nil, err
	}
	return d.c, d.cmd.Process.Pid, d.stop, nil
}

// daemonProc is a daemon started as a child process.
type daemonProc struct {
	c    *sbx.Client
	addr string
	cmd  *exec.Cmd
}

func (d *daemonProc) stop() { _ = d.cmd.Process.Signal(os.Interrupt); _ = d.cmd.Wait() }

// startDaemonProc starts `sbx serve` as startDaemonProcess does and waits
// until it serves.
func startDaemonProc(sbxBin, dataDir string, args ...string) (*daemonProc, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(sbxBin, append([]string{"serve", "--listen", addr, "--data-dir", dataDir, "--warm-pool", "0", "--network=false"}, args...)...)
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", sbxBin, err)
	}
	d := &daemonProc{c: sbx.NewClient(addr), addr: addr, cmd: cmd}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := d.c.List(ctx)
		cancel()
		if err == nil {
			return d, nil
		}
		if time.Now().After(deadline) {
			d.stop()
			return nil, errors.Join(errors.New("daemon did not serve"), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
