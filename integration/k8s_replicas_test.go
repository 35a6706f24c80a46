package integration

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sbxdev/sbx/internal/runtime/kubernetes/k8stest"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// startReplica starts one `sbx serve --state kubernetes` of a replica set:
// its own data dir and port, the shared namespace for pods and records.
func startReplica(t *testing.T, c *k8stest.Cluster, ns, agentImage string) *daemon {
	t.Helper()
	return startReplicaOpts(t, c, ns, agentImage, daemonOpts{})
}

// startReplicaOpts is startReplica with the harness's options and more
// daemon flags; the image is imported with the harness client's token.
func startReplicaOpts(t *testing.T, c *k8stest.Cluster, ns, agentImage string, o daemonOpts, extraArgs ...string) *daemon {
	t.Helper()
	d := startDaemonOpts(t, o, append([]string{"--state", "kubernetes", "--default-runtime", "kubernetes",
		"--k8s-namespace", ns, "--k8s-kubeconfig", filepath.Join(c.Dir, "pki", "admin.kubeconfig"),
		"--k8s-agent-image", agentImage, "--k8s-instance", "replicas",
		// Small pods: the test node has 2 CPUs for every test at once.
		"--default-cpus", "0.1", "--default-memory", "128M"}, extraArgs...)...)
	// The daemon resolves images in its own store before the cluster pulls
	// them by reference: every replica imports the test image.
	f, err := os.Open(filepath.Join(c.Dir, "images", "pybox.tar"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := d.client().Images().Import(ctx, f, k8stest.PyImage); err != nil {
		t.Fatalf("import %s: %v", k8stest.PyImage, err)
	}
	return d
}

// TestKubernetesReplicas runs two real `sbx serve --state kubernetes`
// replicas on the test cluster: a sandbox created through A is exec'd and
// written through B; A is killed with SIGKILL in the middle of an exec
// through it; B still has the sandbox, its files and its name; a second
// sandbox's name cannot be taken through B; destroy through B removes the
// pod and the records.
func TestKubernetesReplicas(t *testing.T) {
	t0 := time.Now()
	step := func(what string) { t.Logf("%6.2fs %s", time.Since(t0).Seconds(), what) }
	c := k8stest.Get(t)
	ns := c.Namespace(t, "sbx-replicas")
	img := c.AgentImage(t)
	a := startReplica(t, c, ns, img)
	b := startReplica(t, c, ns, img)
	step("replicas up")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	sbA, err := a.client().Create(ctx, sbx.CreateOptions{Name: "shared", Image: k8stest.PyImage, Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatalf("create through A: %v", err)
	}
	id := sbA.ID
	step("created through A")
	// B: by name and by id, exec and files. The first look through B adopts
	// the sandbox (reads its record, re-attaches its agent); later ones
	// read the record only.
	adoptStart := time.Now()
	sbB, err := b.client().Get(ctx, "shared")
	if err != nil {
		t.Fatalf("get by name through B: %v", err)
	}
	adopt := time.Since(adoptStart)
	getStart := time.Now()
	if _, err := b.client().Get(ctx, "shared"); err != nil {
		t.Fatalf("second get through B: %v", err)
	}
	t.Logf("through B: first get (adoption) %v, second get %v; exec true p50 through A %v, through B %v",
		adopt, time.Since(getStart), execP50(t, sbA), execP50(t, sbB))
	if sbB.ID != id {
		t.Fatalf("B resolves shared to %s, want %s", sbB.ID, id)
	}
	if err := sbB.WriteFile(ctx, "/tmp/from-b", []byte("written through B"), 0o644); err != nil {
		t.Fatalf("write through B: %v", err)
	}
	res, err := sbA.Run(ctx, "cat", "/tmp/from-b")
	if err != nil || stdout(res) != "written through B" {
		t.Fatalf("read through A of B's write: %q, %v", stdout(res), err)
	}
	if _, err := b.client().Create(ctx, sbx.CreateOptions{Name: "shared", Image: k8stest.PyImage}); err == nil || !strings.Contains(err.Error(), "already") {
		t.Errorf("second create of name shared through B: got %v, want already exists", err)
	}

	// Kill A with SIGKILL while an exec through it runs.
	running := make(chan error, 1)
	go func() {
		_, err := sbA.Run(context.Background(), "sh", "-c", "echo started > /tmp/a-exec; sleep 60")
		running <- err
	}()
	waitK8s(t, 30*time.Second, "the exec through A to start", func() bool {
		r, err := sbB.Run(ctx, "cat", "/tmp/a-exec")
		return err == nil && strings.TrimSpace(stdout(r)) == "started"
	})
	a.kill9()
	step("A killed")
	if err := <-running; err == nil {
		t.Errorf("exec through the killed replica ended without an error")
	}
	step("exec through A ended")

	// Everything acknowledged is intact on B.
	got, err := b.client().Get(ctx, id)
	if err != nil {
		t.Fatalf("get through B after A died: %v", err)
	}
	if got.Info.GetName() != "shared" || got.Info.GetState().String() != "SANDBOX_STATE_RUNNING" {
		t.Errorf("after A died: name %q state %v, want shared running", got.Info.GetName(), got.Info.GetState())
	}
	data, err := got.ReadFile(ctx, "/tmp/from-b")
	if err != nil || !bytes.Equal(data, []byte("written through B")) {
		t.Errorf("file after A died: %q, %v", data, err)
	}
	r, err := got.Run(ctx, "python3", "-c", "print(6*7)")
	if err != nil || strings.TrimSpace(stdout(r)) != "42" {
		t.Errorf("exec through B after A died: %q, %v", stdout(r), err)
	}
	list, err := b.client().List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != id {
		t.Errorf("list through B: %d sandboxes (%v), want [%s]", len(list), err, id)
	}

	// Destroy through B: pod and records go, the name is free.
	step("checked on B")
	if err := got.Destroy(ctx); err != nil {
		t.Fatalf("destroy through B: %v", err)
	}
	if _, err := b.client().Get(ctx, "shared"); err == nil {
		t.Errorf("get after destroy: found, want not found")
	}
	waitK8s(t, 60*time.Second, "the pod and the records to go", func() bool {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(pods.Items) != 0 {
			return false
		}
		secs, err := c.Client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: "sbx.dev/kind"})
		return err == nil && len(secs.Items) == 0
	})
	again, err := b.client().Create(ctx, sbx.CreateOptions{Name: "shared", Image: k8stest.PyImage})
	if err != nil {
		t.Fatalf("re-create of the freed name through B: %v", err)
	}
	if err := again.Destroy(ctx); err != nil {
		t.Errorf("destroy: %v", err)
	}
}

// waitK8s polls cond until it holds or timeout passes (then fails t).
func waitK8s(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stdout is r's standard output ("" for no result).
func stdout(r *sbx.Result) string {
	if r == nil {
		return ""
	}
	return string(r.Stdout)
}

// execP50 is the median of 20 `true` round trips through s.
func execP50(t *testing.T, s *sbx.Sandbox) time.Duration {
	t.Helper()
	var ds []time.Duration
	for range 20 {
		start := time.Now()
		if _, err := s.Run(context.Background(), "true"); err != nil {
			t.Fatalf("exec true: %v", err)
		}
		ds = append(ds, time.Since(start))
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}
