// Command sbx-bench measures sbx's latencies against floors measured in the
// same run on the same machine, and prints them as ratios:
//
//   - create→ready through the API vs a bare `runc run` of /bin/true on a
//     trivial bundle (the OCI runtime's own cost) and vs `unshare` of all
//     namespaces (the kernel floor);
//   - `exec true` round trip through the API vs fork+exec of /bin/true here;
//   - the floors of our own design: runc with a sandbox's own config, and
//     exec straight through the agent's socket (floors.go);
//   - destroy, one at a time and many at once;
//   - what networking adds to create→ready (public from the namespace pool
//     vs none);
//   - codebases: uploading a 10,000-file tree (vs `tar -x` of it), and `git
//     status` on a 10,000-file repository mounted as a codebase vs on the
//     host (`-codebase-only` runs just these);
//   - load (`-only load`): 64 concurrent clients × 60 s of mixed calls,
//     p50/p99 per call and no errors but the deliberate ones (load.go).
//
// It starts its own daemon in-process over a temporary data dir. Needs root.
// Run it with `make bench`.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sbxdev/sbx/internal/daemon"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

func main() {
	n := flag.Int("n", 40, "samples per measurement")
	only := flag.String("only", "", "run only this measurement: create, exec, network, permfs, codebase, files, neighbours, load, scale, metrics, runtimes or ab")
	agent := flag.String("agent", "bin/sbx-agent", "sbx-agent binary")
	runtimeBin := flag.String("oci-runtime", "", "OCI runtime for the daemon (default: auto)")
	scaleSizes := flag.String("scale-n", "100,1000", "with -only scale or metrics: the numbers of sandboxes to measure at (comma-separated)")
	sbxBin := flag.String("sbx", "bin/sbx", "with -only scale or metrics: the sbx binary run as the daemon")
	scaleSustain := flag.Duration("scale-sustain", 30*time.Second, "with -only scale: how long the sustained warm creates run")
	scaleCold := flag.Int("scale-cold", 20, "with -only scale: cold creates taking turns with runc run, one at a time")
	scaleNet := flag.String("scale-net", "sbxsc0,sbxscale,10.214.0.0/16,7491", "with -only scale: the daemons' bridge, nftables table, subnet and box API port (comma-separated), so runs beside other daemons do not collide")
	codebaseOnly := flag.Bool("codebase-only", false, "same as -only codebase")
	var nbOpts neighbourOpts
	flag.Uint64Var(&nbOpts.boxesShares, "boxes-cpu-shares", 0, "neighbours, runtimes, files: the daemon's --boxes-cpu-shares (0: its default)")
	flag.Uint64Var(&nbOpts.benchShares, "bench-cpu-shares", 0, "neighbours, files: run the bench and its daemon in a cgroup v1 cpu group of these shares (e.g. 262144 with -boxes-cpu-shares 262144 or 32768), so that other load on the machine weighs little against the daemon and the boxes")
	baseline := flag.String("baseline", "", "with -only ab or files: a directory holding the old build's sbx and sbx-agent to compare the new one (next to -agent) with")
	abBombs := flag.String("bombs", "", "with -only ab: the bombs its neighbour rounds run, comma-separated (fork, memory, disk, fds, stdout, cpu; default all)")
	rounds := flag.Int("rounds", 0, "neighbours: instead of each bomb alone and all together once, alternate this many rounds of at rest and all bombs together, pooled (steadier on a machine with other load)")
	flag.Parse()
	if *codebaseOnly {
		*only = "codebase"
	}
	runs := map[string]func(n int, agentPath, runtimeBin string) error{
		"":         run,
		"create":   runCreate,
		"exec":     runExec,
		"network":  runNetwork,
		"codebase": runCodebase,
		"files": func(n int, agentPath, _ string) error {
			if *baseline != "" {
				// The old build's data path against this one's, taking
				// turns: `make bench ARGS="-only files -baseline /tmp/main/bin"`.
				return runFilesAB(n, agentPath, *baseline, nbOpts)
			}
			return runFiles(n, agentPath, nbOpts)
		},
		"permfs": func(_ int, agentPath, runtimeBin string) error { return runPermFS(agentPath, runtimeBin) },
		// Not in the default run (about a minute of bombs): `make bench
		// ARGS="-only neighbours"`.
		"neighbours": func(n int, agentPath, runtimeBin string) error {
			nbOpts.rounds = *rounds
			return runNeighbours(n, agentPath, runtimeBin, nbOpts)
		},
		// The new build against an old one (-baseline DIR) in one run:
		// `make bench ARGS="-only ab -baseline /tmp/main/bin -rounds 2"`.
		"ab": func(n int, agentPath, _ string) error {
			if *abBombs != "" {
				nbOpts.bombs = strings.Split(*abBombs, ",")
			}
			return runAB(n, agentPath, *baseline, *rounds, nbOpts)
		},
		// 64 clients × 60 s of mixed calls: `make bench ARGS="-only load"`
		// (-load-clients, -load-duration).
		"load": runLoad,
		// oci next to gvisor on one daemon: `make bench ARGS="-only runtimes"`.
		"runtimes": func(n int, agentPath, runtimeBin string) error {
			return runRuntimes(n, agentPath, runtimeBin, nbOpts.boxesShares)
		},
		// Not in the default run (minutes at 1000 sandboxes): `make bench
		// ARGS="-only scale"`.
		// /metrics, Stats and the sampler at -scale-n idle sandboxes:
		// `make bench ARGS="-only metrics -scale-n 100,1000"`.
		"metrics": func(_ int, agentPath, runtimeBin string) error {
			sizes, err := parseSizes(*scaleSizes)
			if err != nil {
				return err
			}
			return runMetrics(sizes, *sbxBin, agentPath, runtimeBin)
		},
		"scale": func(_ int, agentPath, runtimeBin string) error {
			sizes, err := parseSizes(*scaleSizes)
			if err != nil {
				return err
			}
			net, err := parseScaleNet(*scaleNet)
			if err != nil {
				return err
			}
			return runScale(sizes, net, *sbxBin, agentPath, runtimeBin, scaleOpts{sustain: *scaleSustain, coldRounds: *scaleCold})
		},
	}
	f, ok := runs[*only]
	if !ok {
		fmt.Fprintf(os.Stderr, "sbx-bench: -only %q: not a measurement\n", *only)
		os.Exit(2)
	}
	if err := f(*n, *agent, *runtimeBin); err != nil {
		fmt.Fprintln(os.Stderr, "sbx-bench:", err)
		os.Exit(1)
	}
}

type result struct {
	name string
	ds   []time.Duration
	// failed counts samples that failed (runs that go on despite them).
	failed   int
	firstErr error
}

func (r result) p(q float64) time.Duration {
	if len(r.ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), r.ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(q*float64(len(s)-1))]
}

// measure times f n times; between (if given) runs untimed before each sample.
func measure(name string, n int, f func() error, between ...func()) (result, error) {
	r := result{name: name}
	for range n {
		for _, b := range between {
			b()
		}
		t0 := time.Now()
		if err := f(); err != nil {
			return r, fmt.Errorf("%s: %w", name, err)
		}
		r.ds = append(r.ds, time.Since(t0))
	}
	return r, nil
}

type task struct {
	name string
	f    func() error
}

// measureTogether measures tasks taking turns: one sample of each per round.
func measureTogether(n int, tasks ...task) ([]result, error) {
	rs := make([]result, len(tasks))
	for i, t := range tasks {
		rs[i].name = t.name
	}
	for range n {
		for i, t := range tasks {
			t0 := time.Now()
			if err := t.f(); err != nil {
				return rs, fmt.Errorf("%s: %w", t.name, err)
			}
			rs[i].ds = append(rs[i].ds, time.Since(t0))
		}
	}
	return rs, nil
}

// coldResults are cold creates and the runtime's floors, measured together.
type coldResults struct {
	runc, create, sandboxRunc, noSeccomp result
}

// coldCreates measures cold creates through c (a daemon over tmp/data, no
// warm pool) taking turns with `runc run` of a trivial bundle and of the
// sandbox's own config, so that the machine's drift (a shared VM here) does
// not land on one side of a ratio. It returns the sandboxes it made.
func coldCreates(ctx context.Context, c *sbx.Client, tmp, runtimeBin string, n int) ([]*sbx.Sandbox, coldResults, error) {
	var r coldResults
	bundle, err := trivialBundle(filepath.Join(tmp, "bundle"))
	if err != nil {
		return nil, r, err
	}
	first, err := c.Create(ctx, sbx.CreateOptions{}) // warms up; its config makes the floors
	if err != nil {
		return nil, r, err
	}
	boxes := []*sbx.Sandbox{first}
	hardened, noSeccomp, err := sandboxRuncBundles(tmp, filepath.Join(tmp, "data"), first.ID)
	if err != nil {
		return boxes, r, err
	}
	runcRun := runcRunner(runtimeBin, filepath.Join(tmp, "runc-root"))
	tasks := []task{
		{"runc run /bin/true (trivial bundle)", runcRun(bundle)},
		{"sbx create→ready (API)", func() error {
			sb, err := c.Create(ctx, sbx.CreateOptions{})
			if err == nil {
				boxes = append(boxes, sb)
			}
			return err
		}},
		{"runc run true, sandbox's config", runcRun(hardened)},
	}
	if noSeccomp != "" {
		tasks = append(tasks, task{"  same without seccomp (floor only)", runcRun(noSeccomp)})
	}
	rs, err := measureTogether(n, tasks...)
	if err != nil {
		return boxes, r, err
	}
	r.runc, r.create, r.sandboxRunc = rs[0], rs[1], rs[2]
	r.noSeccomp = result{name: "  same without seccomp: the agent installs it"}
	if noSeccomp != "" {
		r.noSeccomp = rs[3]
	}
	return boxes, r, nil
}

// withDaemon runs f against a daemon of its own (no warm pool) over a
// scratch dir, tmp, that it removes afterwards.
func withDaemon(agentPath, runtimeBin string, f func(ctx context.Context, c *sbx.Client, tmp string) error) error {
	agentPath, tmp, err := benchSetup(agentPath)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	c, stop, err := startDaemon(filepath.Join(tmp, "data"), agentPath, runtimeBin, 0)
	if err != nil {
		return err
	}
	defer stop()
	return f(context.Background(), c, tmp)
}

// runCreate runs only the cold create measurements.
// With the runtime left to the daemon, it then compares runc and crun
// (compareOCIRuntimes).
func runCreate(n int, agentPath, runtimeBin string) error {
	err := withDaemon(agentPath, runtimeBin, func(ctx context.Context, c *sbx.Client, tmp string) error {
		boxes, r, err := coldCreates(ctx, c, tmp, runtimeBin, n)
		for _, b := range boxes {
			_ = b.Destroy(ctx)
		}
		if err != nil {
			return err
		}
		printResults(r.runc, r.sandboxRunc, r.noSeccomp, r.create)
		printCold(r)
		return nil
	})
	if err != nil || runtimeBin != "" {
		return err
	}
	return compareOCIRuntimes(n, agentPath)
}

// printExec prints the exec figures.
func printExec(r execResults) {
	fmt.Printf("exec true p50                     = %s  (target ≤ 2 ms; %.1fx a local fork+exec, %s, measured with it)\n", ms(r.api.p(0.5)), ratio(r.api, r.local), ms(r.local.p(0.5)))
	fmt.Printf("  the agent alone (no daemon)         = %s  (p50; the API hop adds %s)\n", ms(r.agent.p(0.5)), ms(r.api.p(0.5)-r.agent.p(0.5)))
	fmt.Printf("  over the gRPC Exec RPC              = %s  (p50; %.2fx the exec upgrade)\n", ms(r.rpc.p(0.5)), ratio(r.rpc, r.api))
	if len(r.byName.ds) > 0 {
		fmt.Printf("  sbx exec NAME                       = %s  (p50; GetSandbox first, as before: %s, %.2fx)\n",
			ms(r.byName.p(0.5)), ms(r.getFirst.p(0.5)), ratio(r.getFirst, r.byName))
	}
}

// runExec runs only the exec measurements.
func runExec(n int, agentPath, runtimeBin string) error {
	return withDaemon(agentPath, runtimeBin, func(ctx context.Context, c *sbx.Client, tmp string) error {
		sb, err := c.Create(ctx, sbx.CreateOptions{Name: "bench-exec"})
		if err != nil {
			return err
		}
		defer sb.Destroy(ctx) //nolint:errcheck
		r, err := benchExec(ctx, c, filepath.Join(tmp, "data"), sb, n*5)
		if err != nil {
			return err
		}
		printResults(r.local, r.api, r.byName, r.getFirst, r.rpc, r.agent)
		printExec(r)
		return nil
	})
}

// printCold prints the cold create ratios.
func printCold(r coldResults) {
	fmt.Printf("cold create→ready / runc run true = %.2fx  (target ≤ 1.5x)\n", ratio(r.create, r.runc))
	fmt.Printf("  runc with the sandbox's config      = %.2fx runc run true (hardening: userns, seccomp, cgroups, mounts)\n", ratio(r.sandboxRunc, r.runc))
	if len(r.noSeccomp.ds) > 0 {
		fmt.Printf("  seccomp profile in the runtime      = %s  (p50 difference)\n", ms(r.sandboxRunc.p(0.5)-r.noSeccomp.p(0.5)))
	}
	fmt.Printf("  create above that runc floor        = %s  (p50: prepare, agent start, API and store)\n", ms(r.create.p(0.5)-r.sandboxRunc.p(0.5)))
}

func ratio(a, b result) float64 { return float64(a.p(0.5)) / float64(b.p(0.5)) }

// printResults prints a table of p50 and p90.
func printResults(rs ...result) {
	fmt.Printf("%-40s %10s %10s\n", "measurement", "p50", "p90")
	for _, r := range rs {
		if len(r.ds) == 0 {
			fmt.Println(r.name)
			continue
		}
		fmt.Printf("%-40s %10s %10s\n", r.name, ms(r.p(0.5)), ms(r.p(0.9)))
	}
}

// startDaemon runs a daemon in-process over dataDir.
func startDaemon(dataDir, agentPath, runtimeBin string, pool int, opts ...func(*daemon.Config)) (*sbx.Client, func(), error) {
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	errc := make(chan error, 1)
	cfg := daemon.Config{
		Listen: "127.0.0.1:0", DataDir: dataDir, AgentPath: agentPath, OCIRuntime: runtimeBin, WarmPool: pool,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Ready:  func(addr string) { ready <- addr },
	}
	for _, o := range opts {
		o(&cfg)
	}
	go func() { errc <- daemon.Run(ctx, cfg) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-errc }) }
	select {
	case addr := <-ready:
		return sbx.NewClient(addr), stop, nil
	case err := <-errc:
		cancel()
		return nil, func() {}, fmt.Errorf("daemon: %w", err)
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%7.2f ms", float64(d.Microseconds())/1000) }

// benchSetup checks for root and returns the agent's absolute path and a
// scratch dir (mode 0711, so boxes' mapped root can traverse it) the caller
// removes.
func benchSetup(agentPath string) (absAgent, tmp string, err error) {
	if os.Geteuid() != 0 {
		return "", "", fmt.Errorf("needs root")
	}
	absAgent, _ = filepath.Abs(agentPath)
	if tmp, err = os.MkdirTemp("", "sbx-bench-"); err != nil {
		return "", "", err
	}
	_ = os.Chmod(tmp, 0o711)
	return absAgent, tmp, nil
}

func run(n int, agentPath, runtimeBin string) error {
	agentPath, tmp, err := benchSetup(agentPath)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	// Floors.
	trueRes, err := measure("fork+exec /bin/true", n, func() error { return exec.Command("/bin/true").Run() })
	if err != nil {
		return err
	}
	unshareRes, err := measure("unshare all namespaces + true", n, func() error {
		return exec.Command("unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount", "--net", "--uts", "--ipc", "true").Run()
	})
	if err != nil {
		return err
	}
	// sbx through its API: a daemon without a warm pool for cold creates,
	// exec and destroy, then one with a pool for warm creates.
	c, stopDaemon, err := startDaemon(filepath.Join(tmp, "data"), agentPath, runtimeBin, 0)
	if err != nil {
		return err
	}
	defer stopDaemon()
	ctx := context.Background()
	v, err := c.Version(ctx)
	if err != nil {
		return err
	}
	boxes, cold, err := coldCreates(ctx, c, tmp, runtimeBin, n)
	if err != nil {
		return err
	}
	runcRes, createRes, sbRuncRes, sbRuncNoSeccompRes := cold.runc, cold.create, cold.sandboxRunc, cold.noSeccomp
	hostRes, imageRes, err := benchImage(ctx, c, tmp, n/2)
	if err != nil {
		return err
	}
	permGuarded, permPlain, err := benchPermFS(ctx, c)
	if err != nil {
		return err
	}
	sb := boxes[0]
	execRes, err := benchExec(ctx, c, filepath.Join(tmp, "data"), sb, n*5)
	if err != nil {
		return err
	}
	k := 0
	destroyRes, err := measure("sbx destroy (API)", len(boxes)/2, func() error {
		k++
		return boxes[k-1].Destroy(ctx)
	})
	if err != nil {
		return err
	}
	rest := boxes[k:]
	t0 := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var destroyErr error
	for _, b := range rest {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.Destroy(ctx); err != nil {
				mu.Lock()
				destroyErr = err
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	parallel := time.Since(t0)
	if destroyErr != nil {
		return destroyErr
	}
	stopDaemon()

	cw, stopWarm, err := startDaemon(filepath.Join(tmp, "data-warm"), agentPath, runtimeBin, 1)
	if err != nil {
		return err
	}
	defer stopWarm()
	var warmBoxes []*sbx.Sandbox
	warmRes, err := measure("sbx create→ready, warm pool (API)", n, func() error {
		sb, err := cw.Create(ctx, sbx.CreateOptions{MemoryBytes: 256 << 20})
		if err == nil {
			warmBoxes = append(warmBoxes, sb)
		}
		return err
	}, func() { time.Sleep(250 * time.Millisecond) }) // let the pool refill between samples
	if err != nil {
		return err
	}
	for _, b := range warmBoxes {
		_ = b.Destroy(ctx)
	}
	stopWarm()

	noneRes, publicRes, allowRes, err := benchNetwork(ctx, filepath.Join(tmp, "data-net"), agentPath, runtimeBin, n)
	if err != nil {
		return err
	}
	uploadRes, tarxRes, gitHost, gitBox, err := benchCodebase(ctx, filepath.Join(tmp, "codebase"), agentPath, runtimeBin, n)
	if err != nil {
		return err
	}

	rt := ""
	for _, r := range v.GetRuntimes() {
		rt = r.GetHealthDetail()
	}
	fmt.Printf("sbx-bench: %d samples each; runtime: %s\n\n", n, rt)
	printResults(trueRes, unshareRes, runcRes, sbRuncRes, sbRuncNoSeccompRes, createRes, warmRes, hostRes, imageRes, noneRes, publicRes, allowRes, execRes.api, execRes.rpc, execRes.agent, destroyRes)
	fmt.Printf("%-40s %10s  (%d sandboxes at once; %s each if serialised)\n", "sbx destroy, concurrent (wall)", ms(parallel), len(rest), ms(destroyRes.p(0.5)*time.Duration(len(rest))))
	fmt.Println()
	printCold(cold)
	fmt.Printf("warm create→ready / runc run true = %.2fx\n", ratio(warmRes, runcRes))
	fmt.Printf("cold create→ready / unshare floor = %.2fx\n", ratio(createRes, unshareRes))
	fmt.Printf("warm create→ready / unshare floor = %.2fx\n", ratio(warmRes, unshareRes))
	fmt.Printf("5-layer image / host image create = %.2fx  (target ≤ 1.5x)\n", ratio(imageRes, hostRes))
	printExec(execRes)
	fmt.Printf("destroy p50                       = %s  (target ≤ 10 ms)\n", ms(destroyRes.p(0.5)))
	printNetwork(noneRes, publicRes, allowRes)
	printPermFS(permGuarded, permPlain)
	printCodebase(uploadRes, tarxRes, gitHost, gitBox)
	return nil
}

func printPermFS(guarded, plain time.Duration) {
	fmt.Printf("open+read 1KiB+close, guarded / plain overlay = %.2fx  (%.1f µs vs %.1f µs p50; target ≤ 2x)\n",
		float64(guarded)/float64(plain), float64(guarded.Nanoseconds())/1000, float64(plain.Nanoseconds())/1000)
}

// runCodebase runs only the codebase measurements.
func runCodebase(n int, agentPath, runtimeBin string) error {
	agentPath, tmp, err := benchSetup(agentPath)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	uploadRes, tarxRes, gitHost, gitBox, err := benchCodebase(context.Background(), filepath.Join(tmp, "codebase"), agentPath, runtimeBin, n)
	if err != nil {
		return err
	}
	printCodebase(uploadRes, tarxRes, gitHost, gitBox)
	return nil
}

// runPermFS runs only the path guard measurement.
func runPermFS(agentPath, runtimeBin string) error {
	return withDaemon(agentPath, runtimeBin, func(ctx context.Context, c *sbx.Client, _ string) error {
		g, p, err := benchPermFS(ctx, c)
		if err != nil {
			return err
		}
		printPermFS(g, p)
		return nil
	})
}

// trivialBundle makes an OCI bundle running /bin/true from the host's /usr
// with runc's default namespaces: the runtime's own cost, nothing of ours.
func trivialBundle(dir string) (string, error) {
	rootfs := filepath.Join(dir, "rootfs")
	for _, d := range []string{"usr", "proc", "dev", "sys", "tmp"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return "", err
		}
	}
	for _, l := range []string{"bin", "lib", "lib64", "sbin"} {
		if err := os.Symlink("usr/"+l, filepath.Join(rootfs, l)); err != nil {
			return "", err
		}
	}
	spec := map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"args": []string{"/bin/true"}, "cwd": "/", "env": []string{"PATH=/usr/bin:/bin"},
			"user": map[string]any{"uid": 0, "gid": 0}, "noNewPrivileges": true,
		},
		"root":     map[string]any{"path": "rootfs", "readonly": true},
		"hostname": "bench",
		"mounts": []map[string]any{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "mode=755", "size=65536k"}},
			{"destination": "/usr", "type": "bind", "source": "/usr", "options": []string{"rbind", "ro", "nosuid", "nodev"}},
		},
		"linux": map[string]any{
			"namespaces": []map[string]string{{"type": "pid"}, {"type": "mount"}, {"type": "ipc"}, {"type": "uts"}, {"type": "network"}},
		},
	}
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return "", err
	}
	return dir, os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644)
}
