package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// The observing measurements (`sbx-bench -only metrics`, issue 16): one
// daemon (`sbx serve` as a child, no networking, the default 5 s sampling)
// is taken through each size N of idle sandboxes, and at each measured:
//   - a /metrics scrape's time and size (the daemon's and every sandbox's
//     series) and one Stats call for all sandboxes, beside the same at N=0
//     (only the daemon's own series) in the same run;
//   - the daemon's CPU over a quiet window (the sampler is all it does
//     then), beside the same window at N=0, and the sampler's own mean
//     cycle time from sbx_sampler_cycle_seconds.

// metricsWindow is how long the daemon's idle CPU is measured at each size.
const metricsWindow = 30 * time.Second

// procCPU returns pid's user+system CPU time.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// scrapeOnce GETs /metrics and returns its size.
func scrapeOnce(addr string) (int, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return int(n), err
}

// metricValue returns the value of the series line that starts with name
// in a scrape (0 if absent).
func metricValue(addr, name string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

type metricsPoint struct {
	n             int
	scrape, stats result
	size          int
	cpu           time.Duration // over metricsWindow
	cycleMean     time.Duration // the sampler's, over the window
}

func measureMetricsAt(ctx context.Context, d *scaleDaemon, n int) (metricsPoint, error) {
	p := metricsPoint{n: n}
	var err error
	// Two samples in, every sandbox is in the cache.
	time.Sleep(11 * time.Second)
	if p.size, err = scrapeOnce(d.addr); err != nil {
		return p, err
	}
	if p.scrape, err = measure("scrape", 50, func() error { _, err := scrapeOnce(d.addr); return err }); err != nil {
		return p, err
	}
	if p.stats, err = measure("stats", 50, func() error {
		st, err := d.c.Stats(ctx, false)
		if err == nil && len(st.GetSandboxes()) < n {
			err = fmt.Errorf("stats has %d sandboxes, want %d", len(st.GetSandboxes()), n)
		}
		return err
	}); err != nil {
		return p, err
	}
	sum0, no0 := metricValue(d.addr, "sbx_sampler_cycle_seconds_sum"), metricValue(d.addr, "sbx_sampler_cycle_seconds_count")
	cpu0 := procCPU(d.pid)
	time.Sleep(metricsWindow)
	p.cpu = procCPU(d.pid) - cpu0
	sum1, no1 := metricValue(d.addr, "sbx_sampler_cycle_seconds_sum"), metricValue(d.addr, "sbx_sampler_cycle_seconds_count")
	if no1 > no0 {
		p.cycleMean = time.Duration((sum1 - sum0) / (no1 - no0) * float64(time.Second))
	}
	return p, nil
}

func runMetrics(sizes []int, sbxBin, agentPath, runtimeBin string) error {
	agentPath, tmp, err := benchSetup(agentPath)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if sbxBin, err = filepath.Abs(sbxBin); err != nil {
		return err
	}
	addr, err := freePort()
	if err != nil {
		return err
	}
	d := &scaleDaemon{sbxBin: sbxBin, agent: agentPath, runtimeBin: runtimeBin, addr: addr,
		dataDir: filepath.Join(tmp, "data"), logPath: filepath.Join(tmp, "daemon.log")}
	ctx := context.Background()
	if _, err := d.start(); err != nil {
		return err
	}
	defer d.shutdown(ctx)
	var boxes []*sbx.Sandbox
	var points []metricsPoint
	for _, n := range append([]int{0}, sizes...) {
		if k := n - len(boxes); k > 0 {
			made := make([]*sbx.Sandbox, k)
			took, failed, err := concurrently(k, func(i int) error {
				sb, err := d.c.Create(ctx, sbx.CreateOptions{MemoryBytes: 32 << 20})
				made[i] = sb
				return err
			})
			for _, sb := range made {
				if sb != nil {
					boxes = append(boxes, sb)
				}
			}
			if failed > 0 {
				return fmt.Errorf("creating %d sandboxes: %d failed: %w", k, failed, err)
			}
			fmt.Printf("   made %d sandboxes in %s\n", k, took.Round(time.Millisecond))
		}
		p, err := measureMetricsAt(ctx, d, n)
		if err != nil {
			return fmt.Errorf("at %d sandboxes: %w", n, err)
		}
		points = append(points, p)
		fmt.Printf("== N=%d: scrape p50 %s p99 %s, %d bytes; stats p50 %s; daemon CPU %.2f%% of a core (sampler cycle %s)\n",
			n, ms(p.scrape.p(0.5)), ms(p.scrape.p(0.99)), p.size, ms(p.stats.p(0.5)),
			100*p.cpu.Seconds()/metricsWindow.Seconds(), p.cycleMean.Round(time.Microsecond))
	}
	base := points[0]
	fmt.Printf("\n%-8s %14s %14s %12s %14s %16s %14s\n", "N", "scrape p50", "vs N=0", "bytes", "stats p50", "daemon CPU", "sampler cycle")
	for _, p := range points {
		fmt.Printf("%-8d %14s %13.1fx %12d %14s %15.2f%% %14s\n", p.n, ms(p.scrape.p(0.5)), ratio(p.scrape, base.scrape), p.size,
			ms(p.stats.p(0.5)), 100*p.cpu.Seconds()/metricsWindow.Seconds(), p.cycleMean.Round(time.Microsecond))
	}
	fmt.Printf("(daemon CPU: %% of one core over %s of idle sandboxes, the sampler every 5 s; N=0 is the same daemon with none)\n", metricsWindow)
	concurrently(len(boxes), func(i int) error { return boxes[i].Destroy(ctx) }) //nolint:errcheck
	return nil
}
