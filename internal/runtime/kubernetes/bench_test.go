package kubernetes_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/agentconn"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/kubernetes"
	"github.com/sbxdev/sbx/internal/runtime/kubernetes/k8stest"
	"github.com/sbxdev/sbx/internal/runtime/testsuite"
)

// TestBenchFigures measures, in one run on the test cluster, the driver's
// create→ready (Create returns once the agent answered Hello) and an
// `exec true` round trip over a kept agent connection, beside `kubectl run`
// of a trivial pod until Ready and `kubectl exec true`. It logs p50/p99 and
// asserts nothing about speed (the machine is shared): SBX_K8S_BENCH=N runs
// it with N rounds.
func TestBenchFigures(t *testing.T) {
	n := 0
	if v := os.Getenv("SBX_K8S_BENCH"); v != "" {
		fmt.Sscan(v, &n)
	}
	if n <= 0 {
		t.Skip("SBX_K8S_BENCH=N (rounds) unset")
	}
	newDriver := newDriverFunc(t, "")
	c := k8stest.Get(t)
	d := newDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	var create, execTrue, kRun, kExec []time.Duration
	for range n {
		spec := withImage(testsuite.NewSpec("bench"))
		t0 := time.Now()
		h, err := d.Create(ctx, spec)
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		create = append(create, time.Since(t0))
		// As the daemon does: the framed exec protocol, a connection
		// dialled ahead (agentconn's spare).
		conn := agentconn.New(func(ctx context.Context) (net.Conn, error) { return d.Dial(ctx, h) },
			agentconn.WithExecDial(func(ctx context.Context) (net.Conn, error) {
				return d.(runtime.ExecDialer).DialExec(ctx, h)
			}))
		for range 5 {
			t0 := time.Now()
			st, err := conn.ExecOnce(ctx, &sbxv1.ExecRequest{Argv: []string{"true"}})
			if err != nil {
				t.Fatalf("exec true: %v", err)
			}
			for st.Receive() {
			}
			if err := st.Err(); err != nil {
				t.Fatalf("exec true: %v", err)
			}
			st.Close()
			execTrue = append(execTrue, time.Since(t0))
		}
		conn.Close()
		if err := d.Destroy(ctx, h); err != nil {
			t.Fatalf("Destroy: %v", err)
		}
	}

	ns := c.Namespace(t, "sbx-k8sbench")
	kubectl := func(args ...string) error {
		cmd := exec.CommandContext(ctx, filepath.Join(c.Dir, "bin", "kubectl"), append([]string{"-n", ns}, args...)...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(c.Dir, "pki", "admin.kubeconfig"))
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("kubectl %v: %w: %s", args, err, out)
		}
		return nil
	}
	for i := range n {
		name := fmt.Sprintf("trivial-%d", i)
		t0 := time.Now()
		if err := kubectl("run", name, "--image="+k8stest.PyImage, "--image-pull-policy=Never", "--restart=Never", "--", "sleep", "600"); err != nil {
			t.Fatal(err)
		}
		if err := kubectl("wait", "--for=condition=Ready", "pod/"+name, "--timeout=60s"); err != nil {
			t.Fatal(err)
		}
		kRun = append(kRun, time.Since(t0))
		for range 5 {
			t0 := time.Now()
			if err := kubectl("exec", name, "--", "true"); err != nil {
				t.Fatal(err)
			}
			kExec = append(kExec, time.Since(t0))
		}
		if err := kubectl("delete", "pod", name, "--grace-period=1", "--wait=false"); err != nil {
			t.Fatal(err)
		}
	}
	report := func(what string, ds []time.Duration) {
		slices.Sort(ds)
		p := func(q float64) time.Duration { return ds[min(len(ds)-1, int(q*float64(len(ds))))] }
		t.Logf("%-40s n=%-3d p50 %8v  p99 %8v", what, len(ds), p(0.5).Round(time.Millisecond), p(0.99).Round(time.Millisecond))
	}
	report("driver create→ready (agent answers)", create)
	report("driver exec true (framed, spare conn)", execTrue)
	report("kubectl run trivial pod → Ready", kRun)
	report("kubectl exec true", kExec)
}

// TestThroughputFigures measures, in one run on the test cluster, N
// creates (create→ready: the agent answered) from 8 clients at once, three
// ways: cold (a driver without a pool), `kubectl run` of a trivial pod
// until Ready (8 in parallel, as a floor of what the cluster itself does),
// and through the warm pool (a pool of 16 ready before the first create,
// refilled as it goes). Each box is destroyed in the background as soon as
// it is ready, so that the node holds about as many pods as clients; the
// wall time ends with the last create. It logs creates/s and p50/p99 per
// create, and how many creates claimed a pool pod; it asserts nothing
// about speed (the machine is shared). SBX_K8S_THROUGHPUT=N runs it (100
// is the figure in docs/DRIVERS.md).
func TestThroughputFigures(t *testing.T) {
	n := 0
	if v := os.Getenv("SBX_K8S_THROUGHPUT"); v != "" {
		fmt.Sscan(v, &n)
	}
	if n <= 0 {
		t.Skip("SBX_K8S_THROUGHPUT=N (creates) unset")
	}
	const clients, poolSize = 8, 16
	e := newPoolEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	// Small pods: the test node has 2 CPUs for every test at once.
	spec := func() runtime.Spec {
		s := poolSpec()
		s.Resources.CPUMillis, s.Resources.MemoryBytes = 20, 64<<20
		return s
	}

	// run makes n creates from clients goroutines with create and destroys
	// each result in the background with destroy.
	run := func(create func(i int) (any, error), destroy func(any)) (wall time.Duration, lat []time.Duration) {
		var mu sync.Mutex
		next := 0
		gone := make(chan any, n)
		var dwg sync.WaitGroup
		for range clients {
			dwg.Add(1)
			go func() {
				defer dwg.Done()
				for h := range gone {
					destroy(h)
				}
			}()
		}
		var wg sync.WaitGroup
		t0 := time.Now()
		for range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					mu.Lock()
					i := next
					next++
					mu.Unlock()
					if i >= n {
						return
					}
					c0 := time.Now()
					h, err := create(i)
					if err != nil {
						t.Errorf("create %d: %v", i, err)
						return
					}
					d := time.Since(c0)
					mu.Lock()
					lat = append(lat, d)
					mu.Unlock()
					gone <- h
				}
			}()
		}
		wg.Wait()
		wall = time.Since(t0)
		close(gone)
		dwg.Wait()
		return wall, lat
	}
	type result struct {
		what string
		wall time.Duration
		lat  []time.Duration
	}
	var results []result
	destroyBox := func(d *kubernetes.Driver) func(any) {
		return func(h any) {
			if err := d.Destroy(context.Background(), h.(runtime.Handle)); err != nil {
				t.Errorf("Destroy: %v", err)
			}
		}
	}

	// Cold.
	cold := e.driver(t, nil, false)
	wall, lat := run(func(int) (any, error) { return cold.Create(ctx, spec()) }, destroyBox(cold))
	results = append(results, result{"driver create→ready, cold", wall, lat})

	// kubectl run, 8 in parallel.
	kubectl := func(args ...string) error {
		cmd := exec.CommandContext(ctx, filepath.Join(e.c.Dir, "bin", "kubectl"), append([]string{"-n", e.ns}, args...)...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(e.c.Dir, "pki", "admin.kubeconfig"))
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("kubectl %v: %w: %s", args, err, out)
		}
		return nil
	}
	wall, lat = run(func(i int) (any, error) {
		name := fmt.Sprintf("trivial-%d", i)
		if err := kubectl("run", name, "--image="+k8stest.PyImage, "--image-pull-policy=Never", "--restart=Never", "--", "sleep", "600"); err != nil {
			return nil, err
		}
		return name, kubectl("wait", "--for=condition=Ready", "pod/"+name, "--timeout=120s")
	}, func(name any) {
		if err := kubectl("delete", "pod", name.(string), "--grace-period=1"); err != nil {
			t.Errorf("%v", err)
		}
	})
	results = append(results, result{"kubectl run trivial pod → Ready", wall, lat})

	// Through the warm pool.
	tmpl := spec()
	warm := e.driver(t, []kubernetes.PoolSpec{{Image: tmpl.Image.Ref, Resources: tmpl.Resources, Size: poolSize}}, true)
	e.waitReady(t, poolSize)
	var claims sync.Map
	wall, lat = run(func(int) (any, error) {
		h, err := warm.Create(ctx, spec())
		if err == nil && claimed(h) {
			claims.Store(h.ID, true)
		}
		return h, err
	}, destroyBox(warm))
	warmN := 0
	claims.Range(func(any, any) bool { warmN++; return true })
	results = append(results, result{fmt.Sprintf("driver create→ready, pool of %d (%d claimed)", poolSize, warmN), wall, lat})

	for _, r := range results {
		slices.Sort(r.lat)
		if len(r.lat) == 0 {
			continue
		}
		p := func(q float64) time.Duration { return r.lat[min(len(r.lat)-1, int(q*float64(len(r.lat))))] }
		t.Logf("%-50s n=%d clients=%d  %6.2f creates/s  p50 %8v  p99 %8v", r.what, len(r.lat), clients,
			float64(len(r.lat))/r.wall.Seconds(), p(0.5).Round(time.Millisecond), p(0.99).Round(time.Millisecond))
	}
}
