package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sbxdev/sbx/internal/runtime/kubernetes/k8stest"
	"github.com/sbxdev/sbx/internal/tenant"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestKubernetesReplicasCode: a code context and a shell session opened
// through replica A are used through replica B with their state carried
// (x=1 on A, print(x) on B), back and forth; a command through B waits
// for one running through A instead of interleaving with it; B lists them;
// after A is killed with SIGKILL, B still runs code in them and closes them.
func TestKubernetesReplicasCode(t *testing.T) {
	t0 := time.Now()
	step := func(what string) { t.Logf("%6.2fs %s", time.Since(t0).Seconds(), what) }
	c := k8stest.Get(t)
	ns := c.Namespace(t, "sbx-replcode")
	img := c.AgentImage(t)
	a := startReplica(t, c, ns, img)
	b := startReplica(t, c, ns, img)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	sb, err := a.client().Create(ctx, sbx.CreateOptions{Image: k8stest.PyImage, Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatalf("create through A: %v", err)
	}
	defer func() { _ = b.client().Sandbox(sb.ID).Destroy(context.Background()) }()
	step("sandbox up")

	cc, err := sb.CreateContext(ctx, "python", sbx.ContextOptions{})
	if err != nil {
		t.Fatalf("create context through A: %v", err)
	}
	ss, err := sb.CreateSession(ctx, sbx.SessionOptions{Shell: "/bin/sh"}) // pybox has no bash
	if err != nil {
		t.Fatalf("create session through A: %v", err)
	}
	onA, onB := a.client().Context(cc.ID), b.client().Context(cc.ID)
	sessA, sessB := a.client().Session(ss.ID), b.client().Session(ss.ID)
	run := func(through *sbx.CodeContext, name, code, want string) {
		t.Helper()
		r, err := through.Run(ctx, code, sbx.RunCodeOptions{Timeout: time.Minute})
		if r == nil {
			r = &sbx.CodeResult{}
		}
		if err != nil || r.Error != "" || string(r.Stdout) != want {
			t.Fatalf("%q through %s: stdout %q (%v %s %s), want %q", code, name, r.Stdout, err, r.Error, r.Stderr, want)
		}
	}
	sh := func(through *sbx.Session, name, cmd, want string) {
		t.Helper()
		r, err := through.Exec(ctx, cmd, sbx.SessionExecOptions{Timeout: time.Minute})
		if r == nil {
			r = &sbx.SessionResult{}
		}
		if err != nil || string(r.Stdout) != want {
			t.Fatalf("%q through %s: stdout %q (%v %s %s), want %q", cmd, name, r.Stdout, err, r.Error, r.Stderr, want)
		}
	}
	run(onA, "A", "x = 1", "")
	run(onB, "B", "print(x)", "1\n")
	run(onA, "A", "x += 1; print(x)", "2\n")
	run(onB, "B", "print(x)", "2\n")
	sh(sessA, "A", "export Y=7; cd /tmp", "")
	sh(sessB, "B", `echo $Y $PWD`, "7 /tmp\n")
	sh(sessA, "A", `echo $Y`, "7\n")
	step("state carried between A and B")
	// Cost: a command through the replica attached (lease take and give
	// back) and commands alternating between replicas (each re-attaches).
	p50 := func(via ...*sbx.CodeContext) time.Duration {
		var ds []time.Duration
		for i := range 10 {
			t0 := time.Now()
			run(via[i%len(via)], "A or B", "pass", "")
			ds = append(ds, time.Since(t0))
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	t.Logf("run code p50: through one replica %v, alternating between two %v", p50(onB), p50(onA, onB))

	// One command at a time: B's waits for A's (which holds the record's
	// lease while it runs) and the outputs stay apart.
	slow := make(chan error, 1)
	var slowOut []byte
	go func() {
		r, err := onA.Run(ctx, "import time\nprint('a1', flush=True)\ntime.sleep(3)\nprint('a2')", sbx.RunCodeOptions{Timeout: time.Minute})
		if r != nil {
			slowOut = r.Stdout
		}
		slow <- err
	}()
	waitK8s(t, 30*time.Second, "A's command to hold the context's lease", func() bool {
		return leaseHolder(ctx, c, ns, cc.ID) != ""
	})
	run(onB, "B", "print('b')", "b\n")
	if err := <-slow; err != nil || string(slowOut) != "a1\na2\n" {
		t.Errorf("the slow command through A: stdout %q, %v; want \"a1\\na2\\n\"", slowOut, err)
	}
	step("concurrent commands ran in turn")

	for name, d := range map[string]*daemon{"A": a, "B": b} {
		ctxs, err := d.client().Contexts(ctx, sb.ID)
		if err != nil || len(ctxs) != 1 || ctxs[0].ID != cc.ID {
			t.Errorf("contexts through %s: %v, %v; want [%s]", name, ctxs, err, cc.ID)
		}
		sess, err := d.client().Sessions(ctx, sb.ID)
		if err != nil || len(sess) != 1 || sess[0].ID != ss.ID {
			t.Errorf("sessions through %s: %v, %v; want [%s]", name, sess, err, ss.ID)
		}
	}
	// A has them last; it dies.
	run(onA, "A", "x = 10", "")
	sh(sessA, "A", "Y=8", "")
	a.kill9()
	step("A killed")
	run(onB, "B", "print(x)", "10\n")
	sh(sessB, "B", `echo $Y`, "8\n")
	step("B runs in them after A died")
	if err := onB.Close(ctx); err != nil {
		t.Fatalf("close context through B: %v", err)
	}
	if err := sessB.Close(ctx); err != nil {
		t.Fatalf("close session through B: %v", err)
	}
	if _, err := onB.Run(ctx, "print(x)", sbx.RunCodeOptions{}); err == nil {
		t.Errorf("run in the closed context: got nil, want an error")
	}
	if ctxs, err := b.client().Contexts(ctx, sb.ID); err != nil || len(ctxs) != 0 {
		t.Errorf("contexts after close: %v, %v; want none", ctxs, err)
	}
	waitK8s(t, 30*time.Second, "the process records to go", func() bool {
		secs, err := c.Client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: "sbx.dev/kind=process-record"})
		return err == nil && len(secs.Items) == 0
	})
}

// leaseHolder is who holds the lease of process id's record ("" if none).
func leaseHolder(ctx context.Context, c *k8stest.Cluster, ns, id string) string {
	sec, err := c.Client.CoreV1().Secrets(ns).Get(ctx, "sbx-proc-"+id, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	var r struct{ Lease struct{ Holder string } }
	if json.Unmarshal(sec.Data["process"], &r) != nil {
		return ""
	}
	return strings.TrimSpace(r.Lease.Holder)
}

// TestKubernetesReplicasQuota: a tenant with max_sandboxes 2 racing six
// creates through two real replicas gets exactly two sandboxes (each
// replica's memory alone admitted two of its own), and a destroy through
// one makes room for a create through the other.
func TestKubernetesReplicasQuota(t *testing.T) {
	const quota, creates = 2, 6
	c := k8stest.Get(t)
	ns := c.Namespace(t, "sbx-replquota")
	img := c.AgentImage(t)
	tok := tenant.NewToken()
	tenants := filepath.Join(t.TempDir(), "tenants.json")
	if err := os.WriteFile(tenants, fmt.Appendf(nil, `{"tenants": [{"name": "acme", "tokens": [%q], "quotas": {"max_sandboxes": %d}}]}`,
		tenant.HashToken(tok), quota), 0o600); err != nil {
		t.Fatal(err)
	}
	a := startReplicaOpts(t, c, ns, img, daemonOpts{token: tok}, "--tenants", tenants)
	b := startReplicaOpts(t, c, ns, img, daemonOpts{token: tok}, "--tenants", tenants)
	// Generous: on the shared test cluster a pod has taken minutes to start
	// while other tests churned hundreds of pods.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		made    []*sbx.Sandbox
		refused int
		others  []error
	)
	defer func() {
		for _, sb := range made {
			_ = sb.Destroy(context.Background())
		}
	}()
	start := make(chan struct{})
	for i := range creates {
		d := a
		if i%2 == 1 {
			d = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			sb, err := d.client().Create(ctx, sbx.CreateOptions{Image: k8stest.PyImage})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				made = append(made, sb)
			case connect.CodeOf(err) == connect.CodeResourceExhausted:
				refused++
			default:
				others = append(others, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(made) != quota || refused != creates-quota || len(others) > 0 {
		t.Fatalf("%d creates over two replicas with max_sandboxes %d: %d made, %d refused, other errors %v; want %d made",
			creates, quota, len(made), refused, others, quota)
	}
	if err := made[0].WithClient(b.client()).Destroy(ctx); err != nil {
		t.Fatalf("destroy through B: %v", err)
	}
	made = made[1:]
	sb, err := a.client().Create(ctx, sbx.CreateOptions{Image: k8stest.PyImage})
	if err != nil {
		t.Fatalf("create through A after a destroy through B: %v", err)
	}
	made = append(made, sb)
}
