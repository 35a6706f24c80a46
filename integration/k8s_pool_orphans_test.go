package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sbxdev/sbx/internal/runtime/kubernetes/k8stest"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestKubernetesPoolOrphans kill -9s a replica of `sbx serve --state
// kubernetes --k8s-warm-pool` whose pool is full and checks that the other
// replica deletes the pool pods it left (their owner's Lease is no longer
// renewed), and nothing else: not the pod the dead replica's pool gave to a
// sandbox (claimed, it is that sandbox's, which keeps working through the
// live replica), not the live replica's own pool pod. The dead replica's
// Lease goes too. Before the Leases nothing ever deleted them.
func TestKubernetesPoolOrphans(t *testing.T) {
	c := k8stest.Get(t)
	ns := c.Namespace(t, "sbx-orphans")
	img := c.AgentImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pods := c.Client.CoreV1().Pods(ns)
	list := func(selector string) []corev1.Pod {
		t.Helper()
		l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			t.Fatalf("listing pods %s: %v", selector, err)
		}
		return l.Items
	}
	lease := []string{"--k8s-pool-lease", "5s"}

	// A fills a pool of 3, a sandbox claims one of them, A refills.
	a := startReplicaOpts(t, c, ns, img, daemonOpts{}, append(lease, "--k8s-warm-pool", k8stest.PyImage+"=3")...)
	waitK8s(t, 2*time.Minute, "A's pool to be ready", func() bool { return len(list("sbx.dev/warm=ready")) == 3 })
	owners := map[string]bool{}
	for _, p := range list("sbx.dev/pool") {
		owners[p.Labels["sbx.dev/pool-owner"]] = true
	}
	if len(owners) != 1 {
		t.Fatalf("pool owners of A's pods: %v, want one", owners)
	}
	var ownerA string
	for o := range owners {
		ownerA = o
	}
	sb, err := a.client().Create(ctx, sbx.CreateOptions{Name: "claimed", Image: k8stest.PyImage, Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatalf("create through A: %v", err)
	}
	boxPods := list("sbx.dev/id=" + sb.ID)
	if len(boxPods) != 1 || !strings.HasPrefix(boxPods[0].Name, "sbx-w") {
		t.Fatalf("pods of sandbox %s: %d, want one claimed from the pool (sbx-w…)", sb.ID, len(boxPods))
	}
	claimedPod := boxPods[0]
	waitK8s(t, 2*time.Minute, "A's pool to refill", func() bool {
		return len(list("sbx.dev/warm=ready,sbx.dev/pool-owner="+ownerA)) == 3
	})

	// B fills a pool of its own of 1.
	b := startReplicaOpts(t, c, ns, img, daemonOpts{}, append(lease, "--k8s-warm-pool", k8stest.PyImage+"=1")...)
	var podB corev1.Pod
	waitK8s(t, 2*time.Minute, "B's pool to be ready", func() bool {
		for _, p := range list("sbx.dev/warm=ready") {
			if p.Labels["sbx.dev/pool-owner"] != ownerA {
				podB = p
				return true
			}
		}
		return false
	})

	a.kill9()
	killed := time.Now()
	waitK8s(t, time.Minute, "B to delete A's pool pods and Lease", func() bool {
		if len(list("sbx.dev/pool-owner="+ownerA)) > 0 {
			return false
		}
		leases, err := c.Client.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{LabelSelector: "sbx.dev/pool-owner=" + ownerA})
		return err == nil && len(leases.Items) == 0
	})
	t.Logf("B deleted the pool pods and the Lease of A %.1fs after A was killed (lease 5 s)", time.Since(killed).Seconds())
	secs, err := c.Client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: "sbx.dev/pool-owner=" + ownerA})
	if err != nil || len(secs.Items) != 0 {
		t.Errorf("secrets of A's pool left: %d (%v), want none", len(secs.Items), err)
	}

	// What was not A's pool's is untouched.
	for _, want := range []corev1.Pod{claimedPod, podB} {
		got, err := pods.Get(ctx, want.Name, metav1.GetOptions{})
		if err != nil || got.UID != want.UID || got.DeletionTimestamp != nil {
			t.Errorf("pod %s after the sweep: %v (deleting: %v), want it kept", want.Name, err, got != nil && got.DeletionTimestamp != nil)
		}
	}
	got, err := b.client().Get(ctx, "claimed")
	if err != nil {
		t.Fatalf("get the claimed sandbox through B: %v", err)
	}
	if r, err := got.Run(ctx, "python3", "-c", "print(6*7)"); err != nil || strings.TrimSpace(stdout(r)) != "42" {
		t.Errorf("exec through B in the sandbox A claimed: %q, %v", stdout(r), err)
	}
	if err := got.Destroy(ctx); err != nil {
		t.Errorf("destroy through B: %v", err)
	}
}
