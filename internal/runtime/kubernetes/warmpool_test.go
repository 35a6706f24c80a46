package kubernetes_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/kubernetes"
	"github.com/sbxdev/sbx/internal/runtime/kubernetes/k8stest"
	"github.com/sbxdev/sbx/internal/runtime/testsuite"
)

// poolEnv is a namespace on the test cluster and what drivers over it need.
type poolEnv struct {
	c   *k8stest.Cluster
	ns  string
	img string
}

func newPoolEnv(t *testing.T) poolEnv {
	c := k8stest.Get(t)
	e := poolEnv{c: c, ns: c.Namespace(t, "sbx-k8swarm"), img: c.AgentImage(t)}
	c.EnsurePyImage(t)
	return e
}

// driver is a driver over the namespace with pool; fill starts filling it
// (a replica that does not fill still claims).
func (e poolEnv) driver(t *testing.T, pool []kubernetes.PoolSpec, fill bool) *kubernetes.Driver {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := kubernetes.New(ctx, kubernetes.Config{
		Client: e.c.Client, Namespace: e.ns, AgentImage: e.img, PullPolicy: corev1.PullNever, Pool: pool, Logger: testLogger(),
	})
	if err != nil {
		t.Fatalf("kubernetes.New: %v", err)
	}
	if info := d.Info(ctx); !info.Healthy {
		t.Fatalf("driver unhealthy: %s", info.Detail)
	}
	if fill {
		d.StartPool()
		t.Cleanup(func() { _ = d.Close(context.Background()) })
	}
	return d
}

// pods lists the namespace's pods matching selector.
func (e poolEnv) pods(t *testing.T, selector string) []corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := e.c.Client.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatalf("listing pods %q: %v", selector, err)
	}
	return l.Items
}

// waitReady waits until n pool pods are ready (their agents answered and
// nobody claimed them).
func (e poolEnv) waitReady(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got := len(e.pods(t, "sbx.dev/warm=ready"))
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ready pool pods: got %d, want %d", got, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type handleData struct {
	Pod string `json:"pod"`
	UID string `json:"uid"`
}

func podOf(t *testing.T, h runtime.Handle) handleData {
	t.Helper()
	var hd handleData
	if err := json.Unmarshal(h.Data, &hd); err != nil || hd.Pod == "" {
		t.Fatalf("handle of %s: %s: no pod (%v)", h.ID, h.Data, err)
	}
	return hd
}

// poolSpec is the tests' box: a tenth of a CPU, so that the pools, the
// boxes and the refills fit the test node's two CPUs together.
// claimed says whether box h is in a pool pod (a cold box's pod is named
// for it).
func claimed(h runtime.Handle) bool {
	var hd handleData
	return json.Unmarshal(h.Data, &hd) == nil && hd.Pod != "sbx-"+h.ID
}

func poolSpec() runtime.Spec {
	s := withImage(testsuite.NewSpec("warm"))
	s.Resources.CPUMillis = 100
	return s
}

// TestWarmPoolClaim claims a pool pod and checks that it became the box
// and kept nothing of the pool: the sandbox's labels only, no env in the
// pod spec (the env and the secret reach the agent at claim), its TLS
// Secret gone. A create with other limits is made cold; the pool refills;
// Close and Destroy leave no pod and no Secret.
func TestWarmPoolClaim(t *testing.T) {
	e := newPoolEnv(t)
	tmpl := poolSpec()
	d := e.driver(t, []kubernetes.PoolSpec{{Image: tmpl.Image.Ref, Resources: tmpl.Resources, Size: 2}}, true)
	e.waitReady(t, 2)

	spec := poolSpec()
	spec.Env = []string{"SBX_TEST=1", "MY_SECRET=s3cret-" + spec.ID}
	spec.Meta = runtime.Meta{Name: "warm-one", Tenant: "acme", Labels: map[string]string{"team": "x"}, Expires: time.Now().Add(time.Hour)}
	h := testsuite.Create(t, d, spec)
	hd := podOf(t, h)
	if !claimed(h) {
		t.Fatalf("box %s is in pod %s, want a pool pod", h.ID, hd.Pod)
	}
	pod, err := e.c.Client.CoreV1().Pods(e.ns).Get(context.Background(), hd.Pod, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading claimed pod: %v", err)
	}
	for k, want := range map[string]string{"sbx.dev/id": spec.ID, "sbx.dev/name": "warm-one", "sbx.dev/tenant": "acme"} {
		if got := pod.Labels[k]; got != want {
			t.Errorf("claimed pod label %s: got %q, want %q", k, got, want)
		}
	}
	for _, k := range []string{"sbx.dev/pool", "sbx.dev/pool-owner", "sbx.dev/warm"} {
		if v, ok := pod.Labels[k]; ok {
			t.Errorf("claimed pod keeps pool label %s=%s", k, v)
		}
	}
	if got := pod.Annotations["sbx.dev/labels"]; got != `{"team":"x"}` {
		t.Errorf("claimed pod annotation sbx.dev/labels: got %q, want %q", got, `{"team":"x"}`)
	}
	if pod.Annotations["sbx.dev/expires"] == "" {
		t.Errorf("claimed pod has no sbx.dev/expires annotation")
	}
	for _, ct := range pod.Spec.Containers {
		if len(ct.Env) > 0 {
			t.Errorf("pool pod container %s has env baked into its spec: %v", ct.Name, ct.Env)
		}
	}
	poolID := strings.TrimPrefix(hd.Pod, "sbx-")
	if _, err := e.c.Client.CoreV1().Secrets(e.ns).Get(context.Background(), poolID+"-tls", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the pool pod's TLS secret: got %v, want NotFound", err)
	}
	r := testsuite.MustExec(t, d, h, "/bin/sh", "-c", `echo "$MY_SECRET $SBX_TEST"; pwd`)
	if want := "s3cret-" + spec.ID + " 1\n/work\n"; r.Stdout != want {
		t.Errorf("env and workdir in the claimed box: got %q, want %q", r.Stdout, want)
	}

	// Other limits: no pool matches, the box is made cold.
	cold := poolSpec()
	cold.Resources.MemoryBytes *= 2
	hc := testsuite.Create(t, d, cold)
	if got, want := podOf(t, hc).Pod, "sbx-"+cold.ID; got != want {
		t.Errorf("create with unpooled limits: pod %s, want %s (cold)", got, want)
	}

	// The pool refills to its size; the claimed pod is not counted.
	e.waitReady(t, 2)

	if err := d.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if left := e.pods(t, "sbx.dev/pool"); len(left) > 0 {
		t.Errorf("pool pods left after Close: %d (%s…)", len(left), left[0].Name)
	}
	for _, h := range []runtime.Handle{h, hc} {
		if err := d.Destroy(context.Background(), h); err != nil {
			t.Fatalf("Destroy(%s): %v", h.ID, err)
		}
	}
	left, err := d.Leftovers(context.Background(), nil)
	if err != nil {
		t.Fatalf("Leftovers: %v", err)
	}
	if len(left) > 0 {
		t.Errorf("left after Close and Destroy: %v", left)
	}
}

// TestWarmPoolReplicasClaimOnce has two drivers over one namespace (two
// daemon replicas; one fills the pool) create boxes at once: every box
// gets a pod of its own (no pool pod is claimed twice), and each pod
// carries the id of the box whose handle names it.
func TestWarmPoolReplicasClaimOnce(t *testing.T) {
	const size, creates = 3, 8
	e := newPoolEnv(t)
	tmpl := poolSpec()
	pools := []kubernetes.PoolSpec{{Image: tmpl.Image.Ref, Resources: tmpl.Resources, Size: size}}
	replicas := []*kubernetes.Driver{e.driver(t, pools, true), e.driver(t, pools, false)}
	e.waitReady(t, size)

	handles := make([]runtime.Handle, creates)
	errs := make([]error, creates)
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := range creates {
		wg.Add(1)
		go func() {
			defer wg.Done()
			handles[i], errs[i] = replicas[i%2].Create(ctx, poolSpec())
		}()
	}
	wg.Wait()
	for i, h := range handles {
		if errs[i] != nil {
			t.Errorf("create %d: %v", i, errs[i])
			continue
		}
		t.Cleanup(func() {
			if err := replicas[i%2].Destroy(context.Background(), h); err != nil {
				t.Errorf("Destroy(%s): %v", h.ID, err)
			}
		})
	}
	if t.Failed() {
		return
	}
	var pods []string
	warm := 0
	for _, h := range handles {
		hd := podOf(t, h)
		pods = append(pods, hd.Pod)
		if claimed(h) {
			warm++
		}
		pod, err := e.c.Client.CoreV1().Pods(e.ns).Get(context.Background(), hd.Pod, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("reading pod %s of box %s: %v", hd.Pod, h.ID, err)
		}
		if got := pod.Labels["sbx.dev/id"]; got != h.ID || string(pod.UID) != hd.UID {
			t.Errorf("pod %s of box %s: labelled %q (uid %s), want %q (uid %s)", hd.Pod, h.ID, got, pod.UID, h.ID, hd.UID)
		}
	}
	slices.Sort(pods)
	if c := slices.Compact(slices.Clone(pods)); len(c) != len(pods) {
		t.Errorf("boxes share pods: %v", pods)
	}
	if warm == 0 || warm > size {
		t.Errorf("boxes made from the pool: got %d, want 1..%d (the pods ready before the creates)", warm, size)
	}
	t.Logf("%d of %d concurrent creates through 2 replicas claimed a pool pod (pool of %d)", warm, creates, size)
}

// TestWarmPoolFigures measures, in one run, create→ready from the warm
// pool (a claim while a pod is ready) and cold (limits no pool holds), on
// the same driver. SBX_K8S_BENCH=N runs it with N rounds; it logs p50/p99
// and asserts only that the claims were warm.
func TestWarmPoolFigures(t *testing.T) {
	n := 0
	if v := os.Getenv("SBX_K8S_BENCH"); v != "" {
		fmt.Sscan(v, &n)
	}
	if n <= 0 {
		t.Skip("SBX_K8S_BENCH=N (rounds) unset")
	}
	e := newPoolEnv(t)
	tmpl := poolSpec()
	d := e.driver(t, []kubernetes.PoolSpec{{Image: tmpl.Image.Ref, Resources: tmpl.Resources, Size: 2}}, true)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var warm, cold []time.Duration
	for range n {
		e.waitReady(t, 2)
		spec := poolSpec()
		t0 := time.Now()
		h, err := d.Create(ctx, spec)
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		warm = append(warm, time.Since(t0))
		if !claimed(h) {
			t.Fatalf("box %s made cold with a ready pool pod", h.ID)
		}
		spec = poolSpec()
		spec.Resources.MemoryBytes *= 2
		t0 = time.Now()
		hc, err := d.Create(ctx, spec)
		if err != nil {
			t.Fatalf("Create cold: %v", err)
		}
		cold = append(cold, time.Since(t0))
		for _, h := range []runtime.Handle{h, hc} {
			if err := d.Destroy(ctx, h); err != nil {
				t.Fatalf("Destroy: %v", err)
			}
		}
	}
	report := func(what string, ds []time.Duration) {
		slices.Sort(ds)
		p := func(q float64) time.Duration { return ds[min(len(ds)-1, int(q*float64(len(ds))))] }
		t.Logf("%-40s n=%-3d p50 %8v  p99 %8v", what, len(ds), p(0.5).Round(time.Millisecond), p(0.99).Round(time.Millisecond))
	}
	report("create→ready, claimed from the pool", warm)
	report("create→ready, cold", cold)
}

// TestClaimedHostname records what a claimed box's hostname is and that
// code in a box cannot change it: the pod keeps the pool pod's hostname (a
// pod's hostname is immutable), and setting the UTS hostname needs
// CAP_SYS_ADMIN, which neither user code nor the agent (same capabilities)
// holds, so the agent cannot give the box the sandbox's hostname after the
// claim either. A cold neighbour's hostname is its own id, untouched by
// the attempts.
func TestClaimedHostname(t *testing.T) {
	e := newPoolEnv(t)
	tmpl := poolSpec()
	d := e.driver(t, []kubernetes.PoolSpec{{Image: tmpl.Image.Ref, Resources: tmpl.Resources, Size: 1}}, true)
	e.waitReady(t, 1)
	box := testsuite.Create(t, d, poolSpec())
	if !claimed(box) {
		t.Fatalf("box %s made cold with a ready pool pod", box.ID)
	}
	nspec := poolSpec()
	nspec.Resources.MemoryBytes *= 2 // no pool: cold, hostname its id
	neighbour := testsuite.Create(t, d, nspec)
	pod := strings.TrimPrefix(podOf(t, box).Pod, "sbx-")
	r := testsuite.MustExec(t, d, box, "/bin/sh", "-c",
		`hostname; hostname evil 2>/dev/null; echo "hostname rc=$?"; (echo evil > /proc/sys/kernel/hostname) 2>/dev/null; echo "proc rc=$?"; hostname`)
	want := pod + "\nhostname rc=1\nproc rc=1\n" + pod + "\n"
	if r.Stdout != want {
		t.Errorf("claimed box's hostname and attempts to set it: got %q, want %q", r.Stdout, want)
	}
	if r := testsuite.MustExec(t, d, neighbour, "hostname"); r.Stdout != neighbour.ID+"\n" {
		t.Errorf("neighbour's hostname: got %q, want %q", r.Stdout, neighbour.ID+"\n")
	}
}
