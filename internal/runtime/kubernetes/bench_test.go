package kubernetes_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/agentconn"
	"github.com/sbxdev/sbx/internal/runtime"
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
