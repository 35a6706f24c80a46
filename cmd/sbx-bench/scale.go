package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// The scale measurements (`sbx-bench -only scale`, issue 13): for each size N
// a daemon (`sbx serve` as a child process, networking on over a bridge,
// table and subnet of its own) is taken from 0 to N idle sandboxes by 8
// concurrent clients, and measured there: create and destroy rates (cold and
// warm), host memory per idle sandbox, the daemon's RSS and fds, exec
// latency across every box, and the time a graceful and a kill -9 restart
// take to serve again with all N re-attached. Each figure is printed beside
// a baseline taken in the same run: `runc run` throughput at the same
// concurrency, exec with one box, restart with no box.

const scaleClients = 8

// scaleDaemon is a `sbx serve` child over one data dir.
type scaleDaemon struct {
	sbxBin, agent, runtimeBin, dataDir, addr, logPath string
	warmPool                                          int
	net                                               scaleNet
	// extra are more `sbx serve` flags.
	extra []string
	cmd   *exec.Cmd
	c     *sbx.Client
	pid   int
	// exited yields the daemon's exit (nil while none runs).
	exited chan error
}

func (d *scaleDaemon) args() []string {
	a := []string{"serve", "--listen", d.addr, "--data-dir", d.dataDir, "--agent", d.agent,
		"--warm-pool", strconv.Itoa(d.warmPool), "--default-timeout", "0", "--log-level", "debug"}
	if d.net.bridge == "" {
		a = append(a, "--network=false")
	} else {
		a = append(a, "--net-bridge", d.net.bridge, "--net-table", d.net.table, "--net-subnet", d.net.subnet,
			"--box-api-port", d.net.apiPort)
	}
	a = append(a, d.extra...)
	if d.runtimeBin != "" {
		a = append(a, "--oci-runtime", d.runtimeBin)
	}
	return a
}

// start runs the daemon and returns how long it took to answer List.
func (d *scaleDaemon) start() (time.Duration, error) {
	logf, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	d.cmd = exec.Command(d.sbxBin, d.args()...)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	t0 := time.Now()
	if err := d.cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s: %w", d.sbxBin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- d.cmd.Wait() }()
	d.c = sbx.NewClient(d.addr)
	deadline := t0.Add(120 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := d.c.Version(ctx)
		cancel()
		if err == nil {
			took := time.Since(t0)
			d.pid, d.exited = d.cmd.Process.Pid, exited
			return took, nil
		}
		select {
		case werr := <-exited:
			return 0, fmt.Errorf("daemon exited before serving (%v); see %s", werr, d.logPath)
		default:
		}
		if time.Now().After(deadline) {
			_ = d.cmd.Process.Kill()
			<-exited
			return 0, fmt.Errorf("daemon did not serve within 120 s: %w", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stop ends the daemon with sig and waits for it to exit.
func (d *scaleDaemon) stop(sig syscall.Signal) time.Duration {
	t0 := time.Now()
	_ = syscall.Kill(d.pid, sig)
	<-d.exited
	d.exited = nil
	return time.Since(t0)
}

// shutdown destroys every sandbox left (a run cut short by an error) and
// stops the daemon, if it runs: sandboxes outlive their daemon.
func (d *scaleDaemon) shutdown(ctx context.Context) {
	if d.exited == nil {
		return
	}
	if boxes, err := d.c.List(ctx); err == nil {
		concurrently(len(boxes), func(i int) error { return boxes[i].Destroy(ctx) }) //nolint:errcheck
	}
	d.stop(syscall.SIGTERM)
}

// rss returns the daemon's resident memory and open fds.
func (d *scaleDaemon) rss() (rssKiB int64, fds int) {
	rssKiB = statusField(d.pid, "VmRSS")
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", d.pid))
	return rssKiB, len(ents)
}

// statusField reads a "kB" field of /proc/pid/status.
func statusField(pid int, name string) int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+":"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}

// memAvailable returns /proc/meminfo's MemAvailable in KiB.
func memAvailable() int64 {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "MemAvailable:"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	return 0
}

// cgroupMemory sums the memory charged to the boxes' cgroups under the
// daemon's parent cgroup (v1 or v2) and counts them.
func cgroupMemory(dataDir string) (bytes int64, n int) {
	parent := cgroupParent(dataDir)
	for _, p := range []struct{ dir, file string }{
		{"/sys/fs/cgroup/memory/" + parent, "memory.usage_in_bytes"},
		{"/sys/fs/cgroup/" + parent, "memory.current"},
	} {
		ents, err := os.ReadDir(p.dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			b, err := os.ReadFile(filepath.Join(p.dir, e.Name(), p.file))
			if err != nil {
				continue
			}
			v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			bytes += v
			n++
		}
		return bytes, n
	}
	return 0, 0
}

// cgroupParent is the parent cgroup of the boxes of the daemon over dataDir
// (internal/daemon's instanceName).
func cgroupParent(dataDir string) string {
	abs, _ := filepath.Abs(dataDir)
	sum := sha256.Sum256([]byte(abs))
	return fmt.Sprintf("sbx-%x", sum[:4])
}

// agentsPrivate sums Private_Dirty and Rss of the sbx-agent processes (the
// boxes' PID 1s) in the daemon's cgroups, in KiB.
func agentsPrivate(dataDir string) (dirtyKiB, rssKiB int64, n int) {
	parent := "/" + cgroupParent(dataDir) + "/"
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if strings.TrimSpace(string(comm)) != "sbx-agent" {
			continue
		}
		if cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid)); !strings.Contains(string(cg), parent) {
			continue // another daemon's
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		if err != nil {
			continue
		}
		n++
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) < 2 {
				continue
			}
			v, _ := strconv.ParseInt(f[1], 10, 64)
			switch f[0] {
			case "Private_Dirty:":
				dirtyKiB += v
			case "Rss:":
				rssKiB += v
			}
		}
	}
	return dirtyKiB, rssKiB, n
}

// concurrently runs f(i) for i in [0, n) on scaleClients workers and
// returns the wall time and the first error (it goes on past errors).
func concurrently(n int, f func(i int) error) (time.Duration, int, error) {
	var next atomic.Int64
	var mu sync.Mutex
	var first error
	failed := 0
	var wg sync.WaitGroup
	t0 := time.Now()
	for range scaleClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					mu.Lock()
					failed++
					if first == nil {
						first = fmt.Errorf("item %d: %w", i, err)
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(t0), failed, first
}

func rate(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }

// scaleNetwork is the network policy of the i-th box: a few of each mode,
// the rest none.
func scaleNetwork(i int) *sbx.NetworkPolicy {
	switch {
	case i < 3:
		return &sbx.NetworkPolicy{Mode: "public"}
	case i < 6:
		return &sbx.NetworkPolicy{Mode: "allow", AllowCIDRs: []string{"192.0.2.1/32"}}
	}
	return &sbx.NetworkPolicy{Mode: "none"}
}

// execAll runs `true` once in every box, one at a time, and returns the
// latencies; failures are counted.
func execAll(ctx context.Context, boxes []*sbx.Sandbox) (result, error) {
	r := result{name: "exec true, each box once"}
	for _, b := range boxes {
		t0 := time.Now()
		res, err := b.Run(ctx, "true")
		if err == nil && res.Code != 0 {
			err = fmt.Errorf("exit %d", res.Code)
		}
		if err != nil {
			r.failed++
			if r.firstErr == nil {
				r.firstErr = fmt.Errorf("sandbox %s: %w", b.ID, err)
			}
			continue
		}
		r.ds = append(r.ds, time.Since(t0))
	}
	return r, nil
}

// restartScale restarts d with sig and returns the time from start to
// serving, and that from start to all n sandboxes listed and answering an
// exec.
func restartScale(ctx context.Context, d *scaleDaemon, sig syscall.Signal, n int) (serving, allExec time.Duration, failed int, err error) {
	d.stop(sig)
	t0 := time.Now()
	if serving, err = d.start(); err != nil {
		return 0, 0, 0, err
	}
	boxes, err := d.c.List(ctx)
	if err != nil {
		return serving, 0, 0, err
	}
	if len(boxes) != n {
		return serving, 0, 0, fmt.Errorf("after restart %d sandboxes listed, want %d", len(boxes), n)
	}
	_, failed, _ = concurrently(len(boxes), func(i int) error {
		res, err := boxes[i].Run(ctx, "true")
		if err == nil && res.Code != 0 {
			err = fmt.Errorf("exit %d", res.Code)
		}
		return err
	})
	return serving, time.Since(t0), failed, nil
}

// runcThroughput runs `runc run` (or runtimeBin's, as runcRunner does) of
// the trivial bundle k times on scaleClients workers and returns runs a
// second.
func runcThroughput(runtimeBin, bundle, root string, k int) (float64, error) {
	run := runcRunner(runtimeBin, root)(bundle)
	wall, _, err := concurrently(k, func(int) error { return run() })
	return rate(k, wall), err
}

// crunThroughput is runcThroughput for crun, run as the oci driver runs
// it, when the daemon picks its runtime (runtimeBin "") and crun is
// installed; 0 otherwise.
func crunThroughput(runtimeBin, bundle, tmp string) (float64, error) {
	if runtimeBin != "" {
		return 0, nil
	}
	crun, err := exec.LookPath("crun")
	if err != nil {
		return 0, nil
	}
	return runcThroughput(crun, bundle, filepath.Join(tmp, "crun-root"), 64)
}

// printCrunBaseline prints creates/s against `crun run` throughput
// measured before and after (nothing if it was not measured).
func printCrunBaseline(creates, before, after float64) {
	if before == 0 || after == 0 {
		return
	}
	fmt.Printf("  beside crun run /bin/true          = %.1f/s before, %.1f/s after; %.2fx\n", before, after, creates/((before+after)/2))
}

// freePort returns a loopback address nothing listens on now.
func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// runScale runs the scale measurements for each size in sizes.
func runScale(sizes []int, net scaleNet, sbxBin, agentPath, runtimeBin string, opts scaleOpts) error {
	agentPath, tmp, err := benchSetup(agentPath)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if sbxBin, err = filepath.Abs(sbxBin); err != nil {
		return err
	}
	bundle, err := trivialBundle(filepath.Join(tmp, "bundle"))
	if err != nil {
		return err
	}
	for _, n := range sizes {
		if err := scaleOnce(n, net, tmp, bundle, sbxBin, agentPath, runtimeBin, opts); err != nil {
			return fmt.Errorf("at %d sandboxes: %w", n, err)
		}
	}
	return nil
}

func scaleOnce(n int, net scaleNet, tmp, bundle, sbxBin, agentPath, runtimeBin string, opts scaleOpts) error {
	ctx := context.Background()
	addr, err := freePort()
	if err != nil {
		return err
	}
	dir := filepath.Join(tmp, fmt.Sprintf("n%d", n))
	d := &scaleDaemon{sbxBin: sbxBin, agent: agentPath, runtimeBin: runtimeBin, addr: addr, net: net,
		dataDir: filepath.Join(dir, "data"), logPath: filepath.Join(tmp, fmt.Sprintf("daemon-%d.log", n))}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return err
	}
	fmt.Printf("== scale N=%d (daemon log %s)\n", n, d.logPath)
	if _, err := d.start(); err != nil {
		return err
	}
	defer d.shutdown(ctx)
	// Baselines with no box: restarts, then exec with one box.
	gracefulBase, _, _, err := restartScale(ctx, d, syscall.SIGTERM, 0)
	if err != nil {
		return fmt.Errorf("graceful restart at N=0: %w", err)
	}
	killBase, _, _, err := restartScale(ctx, d, syscall.SIGKILL, 0)
	if err != nil {
		return fmt.Errorf("kill -9 restart at N=0: %w", err)
	}
	rss0, fds0 := d.rss()
	memBefore := memAvailable()
	one, err := d.c.Create(ctx, sbx.CreateOptions{Network: scaleNetwork(n)})
	if err != nil {
		return err
	}
	exec1, err := measure("exec true, 1 box", 200, func() error {
		_, err := one.Run(ctx, "true")
		return err
	})
	if err != nil {
		return err
	}
	coldFrom := logSize(d.logPath)
	cold1, err := coldVsRunc(ctx, d, runtimeBin, bundle, runcRoot(tmp), opts.coldRounds)
	if err != nil {
		return fmt.Errorf("cold creates beside runc run: %w", err)
	}
	coldTo := logSize(d.logPath)
	runcRate, err := runcThroughput(runtimeBin, bundle, filepath.Join(tmp, "runc-root"), 64)
	if err != nil {
		return err
	}
	crunRate, err := crunThroughput(runtimeBin, bundle, tmp)
	if err != nil {
		return err
	}
	boxes := make([]*sbx.Sandbox, n)
	boxes[0] = one
	wall, failed, err := concurrently(n-1, func(i int) error {
		sb, err := d.c.Create(ctx, sbx.CreateOptions{Network: scaleNetwork(i + 1)})
		boxes[i+1] = sb
		return err
	})
	if failed > 0 {
		return fmt.Errorf("cold creates: %d of %d failed, first: %w", failed, n-1, err)
	}
	coldRate := rate(n-1, wall)
	runcAfter, err := runcThroughput(runtimeBin, bundle, filepath.Join(tmp, "runc-root"), 64)
	if err != nil {
		return err
	}
	crunAfter, err := crunThroughput(runtimeBin, bundle, tmp)
	if err != nil {
		return err
	}
	memAfter := memAvailable()
	cgBytes, cgN := cgroupMemory(d.dataDir)
	dirty, agentRSS, agents := agentsPrivate(d.dataDir)
	rssN, fdsN := d.rss()
	execN, _ := execAll(ctx, boxes)

	gServe, gAll, gFailed, err := restartScale(ctx, d, syscall.SIGTERM, n)
	if err != nil {
		return fmt.Errorf("graceful restart at N=%d: %w", n, err)
	}
	kServe, kAll, kFailed, err := restartScale(ctx, d, syscall.SIGKILL, n)
	if err != nil {
		return fmt.Errorf("kill -9 restart at N=%d: %w", n, err)
	}
	boxes, err = d.c.List(ctx)
	if err != nil {
		return err
	}
	dwall, dfailed, derr := concurrently(len(boxes), func(i int) error { return boxes[i].Destroy(ctx) })
	if dfailed > 0 {
		return fmt.Errorf("destroys: %d failed, first: %w", dfailed, derr)
	}
	d.stop(syscall.SIGTERM)

	warm, err := scaleWarm(ctx, n, net, tmp, bundle, sbxBin, agentPath, runtimeBin, opts)
	if err != nil {
		return fmt.Errorf("warm: %w", err)
	}

	mib := func(kib int64) float64 { return float64(kib) / 1024 }
	fmt.Printf("cold create→ready, one at a time    = %s p50  (runc run /bin/true taking turns: %s; %.2fx; %d rounds)\n",
		ms(cold1.create.p(0.5)), ms(cold1.runc.p(0.5)), ratio(cold1.create, cold1.runc), opts.coldRounds)
	printPhases(d.logPath, coldFrom, coldTo, "false")
	fmt.Printf("creates/s, %d clients, cold         = %6.1f  (runc run /bin/true at %d clients: %.1f/s before, %.1f/s after; %.2fx)\n",
		scaleClients, coldRate, scaleClients, runcRate, runcAfter, coldRate/((runcRate+runcAfter)/2))
	printCrunBaseline(coldRate, crunRate, crunAfter)
	fmt.Printf("creates/s, %d clients, warm burst   = %6.1f  (%d rounds of %d, pool refilled between; %d of %d served warm)\n",
		scaleClients, warm.burstRate, warm.rounds, scaleClients, warm.burstWarm, warm.rounds*scaleClients)
	su := warm.sustained
	fmt.Printf("creates/s, %d clients, warm, %2.0f s   = %6.1f  (create+destroy loops; %d of %d served warm, %d failed; create p50 %s, p99 %s; runc run at %d clients: %.1f/s before, %.1f/s after; %.2fx)\n",
		scaleClients, su.wall.Seconds(), rate(su.creates, su.wall), su.warm, su.creates, su.failed, ms(su.create.p(0.5)), ms(su.create.p(0.99)),
		scaleClients, su.runcBefore, su.runcAfter, rate(su.creates, su.wall)/((su.runcBefore+su.runcAfter)/2))
	printCrunBaseline(rate(su.creates, su.wall), su.crunBefore, su.crunAfter)
	if su.firstErr != nil {
		fmt.Printf("  first failure: %v\n", su.firstErr)
	}
	printPhases(warm.logPath, warm.sustainFrom, warm.sustainTo, "true")
	if warm.inARow > 0 {
		fmt.Printf("creates/s, %d clients, warm, N=%d   = %6.1f  (%d in a row after the bursts, up to N boxes; %d served warm)\n",
			scaleClients, n, warm.sustainedRate, warm.inARow, warm.sustainedWarm)
	}
	if warm.claimFailures > 0 {
		fmt.Printf("  warm hand-overs that failed (went cold): %d; first: %s\n", warm.claimFailures, warm.firstClaimFailure)
	}
	fmt.Printf("destroys/s, %d clients              = %6.1f  (cold daemon, N=%d); warm daemon: %.1f/s\n", scaleClients, rate(len(boxes), dwall), n, warm.destroyRate)
	fmt.Printf("host memory per idle sandbox        = %6.2f MiB  (MemAvailable delta %.0f MiB over %d)\n", mib((memBefore-memAfter)/int64(n)), mib(memBefore-memAfter), n)
	if cgN > 0 {
		fmt.Printf("  charged to the boxes' cgroups     = %6.2f MiB  (%d cgroups)\n", float64(cgBytes)/float64(cgN)/(1<<20), cgN)
	}
	if agents > 0 {
		fmt.Printf("  agent Private_Dirty / Rss         = %6.2f / %.2f MiB  (%d agents)\n", mib(dirty/int64(agents)), mib(agentRSS/int64(agents)), agents)
	}
	fmt.Printf("daemon RSS, fds                     = %6.1f MiB, %d  (at N=0: %.1f MiB, %d; %.1f KiB per box)\n", mib(rssN), fdsN, mib(rss0), fds0, float64(rssN-rss0)/float64(n))
	fmt.Printf("exec true p50 / p99, every box      = %s / %s  (1 box: %s / %s; %d failed)\n", ms(execN.p(0.5)), ms(execN.p(0.99)), ms(exec1.p(0.5)), ms(exec1.p(0.99)), execN.failed)
	if execN.firstErr != nil {
		fmt.Printf("  first exec failure: %v\n", execN.firstErr)
	}
	fmt.Printf("graceful restart to serving         = %s  (all %d listed and exec'd: %s, %d failed; N=0: %s)\n", ms(gServe), n, ms(gAll), gFailed, ms(gracefulBase))
	fmt.Printf("kill -9 restart to serving          = %s  (all %d listed and exec'd: %s, %d failed; N=0: %s)\n", ms(kServe), n, ms(kAll), kFailed, ms(killBase))
	return nil
}

type warmResults struct {
	rounds, burstWarm, sustainedWarm int
	// inARow is how many creates in a row took the daemon to N boxes
	// after the bursts (0 when the bursts made N already).
	inARow int
	// claimFailures counts warm boxes whose hand-over failed (the create
	// then went cold); firstClaimFailure is the first such log line.
	claimFailures                         int
	firstClaimFailure                     string
	burstRate, sustainedRate, destroyRate float64
	// sustained are the create+destroy loops over opts.sustain; its
	// phases are in logPath between sustainFrom and sustainTo.
	sustained              sustainedResult
	logPath                string
	sustainFrom, sustainTo int64
}

// warmIdle is how many boxes the daemon's warm pool holds: the idle count
// of its last "warm pool: box ready" or "warm pool: box taken" log line
// (-1: none yet). The box dirs cannot tell: a box has its agent socket
// before it is handed in.
func warmIdle(logPath string) int {
	b, _ := os.ReadFile(logPath)
	i := -1
	var rest []byte
	for _, msg := range []string{`msg="warm pool: box ready" idle=`, `msg="warm pool: box taken" idle=`} {
		if j := bytes.LastIndex(b, []byte(msg)); j > i {
			i, rest = j, b[j+len(msg):]
		}
	}
	if i < 0 {
		return -1
	}
	if j := bytes.IndexAny(rest, " \n"); j >= 0 {
		rest = rest[:j]
	}
	n, err := strconv.Atoi(string(rest))
	if err != nil {
		return -1
	}
	return n
}

// waitWarm waits until the pool holds at least k boxes, or has held the
// same number for 3 s (its cap is smaller), at most 60 s.
func waitWarm(logPath string, k int) error {
	deadline := time.Now().Add(60 * time.Second)
	last, since := -1, time.Now()
	for {
		n := warmIdle(logPath)
		if n != last {
			last, since = n, time.Now()
		}
		if n >= k || (n > 0 && time.Since(since) > 3*time.Second) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("warm pool holds %d boxes after 60 s, want %d", n, k)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// warmCount counts creates the daemon's log says were served warm.
// (its "sandbox created" lines; the debug "create phases" lines say warm
// too).
func warmCount(logPath string) int {
	b, _ := os.ReadFile(logPath)
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, `msg="sandbox created"`) && strings.Contains(l, " warm=true") {
			n++
		}
	}
	return n
}

// scaleWarm measures creates with the warm pool on: bursts of scaleClients
// concurrent creates with the pool refilled between them, then n creates in
// a row, then destroys.
func scaleWarm(ctx context.Context, n int, net scaleNet, tmp, bundle, sbxBin, agentPath, runtimeBin string, opts scaleOpts) (warmResults, error) {
	var r warmResults
	addr, err := freePort()
	if err != nil {
		return r, err
	}
	d := &scaleDaemon{sbxBin: sbxBin, agent: agentPath, runtimeBin: runtimeBin, addr: addr, warmPool: 2, net: net,
		dataDir: filepath.Join(tmp, fmt.Sprintf("warm%d", n), "data"), logPath: filepath.Join(tmp, fmt.Sprintf("daemon-warm-%d.log", n))}
	if err := os.MkdirAll(filepath.Dir(d.dataDir), 0o711); err != nil {
		return r, err
	}
	if _, err := d.start(); err != nil {
		return r, err
	}
	defer d.shutdown(ctx)
	var mu sync.Mutex
	var boxes []*sbx.Sandbox
	// The default policy (public), that of warm boxes: a claim that changes
	// it also rewrites the box's firewall rules (internal/network).
	create := func(int) error {
		sb, err := d.c.Create(ctx, sbx.CreateOptions{})
		if err == nil {
			mu.Lock()
			boxes = append(boxes, sb)
			mu.Unlock()
		}
		return err
	}
	// A first burst shows the pool the demand; then rounds served from it.
	if _, _, err := concurrently(scaleClients, create); err != nil {
		return r, err
	}
	r.rounds = 5
	var burstWall time.Duration
	before := warmCount(d.logPath)
	for range r.rounds {
		if err := waitWarm(d.logPath, scaleClients); err != nil {
			return r, err
		}
		wall, _, err := concurrently(scaleClients, create)
		if err != nil {
			return r, err
		}
		burstWall += wall
	}
	r.burstWarm = warmCount(d.logPath) - before
	r.burstRate = rate(r.rounds*scaleClients, burstWall)
	if r.sustained.runcBefore, err = runcThroughput(runtimeBin, bundle, runcRoot(tmp), 64); err != nil {
		return r, err
	}
	crunBefore, err := crunThroughput(runtimeBin, bundle, tmp)
	if err != nil {
		return r, err
	}
	r.logPath, r.sustainFrom = d.logPath, logSize(d.logPath)
	su := sustainedWarm(ctx, d, opts.sustain)
	r.sustainTo = logSize(d.logPath)
	if su.runcAfter, err = runcThroughput(runtimeBin, bundle, runcRoot(tmp), 64); err != nil {
		return r, err
	}
	if su.crunAfter, err = crunThroughput(runtimeBin, bundle, tmp); err != nil {
		return r, err
	}
	su.runcBefore, su.crunBefore = r.sustained.runcBefore, crunBefore
	r.sustained = su
	rest := max(n-len(boxes), 0)
	r.inARow = rest
	before = warmCount(d.logPath)
	wall, _, err := concurrently(rest, create)
	if err != nil {
		return r, err
	}
	r.sustainedWarm = warmCount(d.logPath) - before
	r.sustainedRate = rate(rest, wall)
	dwall, _, err := concurrently(len(boxes), func(i int) error { return boxes[i].Destroy(ctx) })
	if err != nil {
		return r, err
	}
	r.destroyRate = rate(len(boxes), dwall)
	log, _ := os.ReadFile(d.logPath)
	for _, l := range strings.Split(string(log), "\n") {
		if strings.Contains(l, "warm pool: handing over a box failed") {
			if r.claimFailures == 0 {
				r.firstClaimFailure = l
			}
			r.claimFailures++
		}
	}
	return r, nil
}

// scaleNet names the scale daemons' network: bridge, nftables table, subnet
// and the port boxes reach the API on.
type scaleNet struct{ bridge, table, subnet, apiPort string }

// parseScaleNet parses -scale-net.
func parseScaleNet(s string) (scaleNet, error) {
	f := strings.Split(s, ",")
	if len(f) != 4 || slices.Contains(f, "") {
		return scaleNet{}, fmt.Errorf("-scale-net %q: want bridge,table,subnet,box-api-port", s)
	}
	if _, err := strconv.ParseUint(f[3], 10, 16); err != nil {
		return scaleNet{}, fmt.Errorf("-scale-net %q: box API port %q is not a port number", s, f[3])
	}
	return scaleNet{bridge: f[0], table: f[1], subnet: f[2], apiPort: f[3]}, nil
}

// parseSizes parses -scale-n.
func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			return nil, fmt.Errorf("-scale-n %q: want sizes of at least 2, comma-separated", s)
		}
		out = append(out, n)
	}
	return out, nil
}
