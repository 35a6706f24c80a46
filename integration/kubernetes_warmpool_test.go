package integration

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sbxdev/sbx/internal/runtime/kubernetes/k8stest"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestKubernetesWarmPool drives a daemon with `--k8s-warm-pool IMAGE=1` on
// the test cluster: a create of that image claims the ready pool pod (the
// sandbox's pod is not named for it), its env and secret reach the box
// though the pod spec holds none, a graceful stop deletes the unclaimed
// pool pods and keeps the sandbox, which the restarted daemon recovers and
// destroys.
func TestKubernetesWarmPool(t *testing.T) {
	c := k8stest.Get(t)
	ns := c.Namespace(t, "sbx-k8s-warm")
	agentImg := c.AgentImage(t)
	img := c.EnsurePyImage(t)
	d := startDaemon(t, "--k8s-namespace", ns, "--k8s-kubeconfig", filepath.Join(c.Dir, "pki", "admin.kubeconfig"),
		"--k8s-agent-image", agentImg, "--k8s-warm-pool", img+"=1")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if out, errOut, code := d.cli("", "images", "import", "--use-archive-tags", filepath.Join(c.Dir, "images", "pybox.tar")); code != 0 {
		t.Fatalf("sbx images import: exit %d: %s %s", code, out, errOut)
	}
	pods := c.Client.CoreV1().Pods(ns)
	waitPods := func(selector string, want int) {
		t.Helper()
		for {
			l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: selector})
			if err != nil {
				t.Fatalf("listing pods %s: %v", selector, err)
			}
			if len(l.Items) == want {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("pods %s: got %d, want %d", selector, len(l.Items), want)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	waitPods("sbx.dev/warm=ready", 1)

	sb, err := d.client().Create(ctx, sbx.CreateOptions{Image: img, Runtime: "kubernetes", Name: "warm-box",
		Env: map[string]string{"GREETING": "hello"}, Secrets: map[string]string{"TOKEN": "t0k"}})
	if err != nil {
		t.Fatalf("create on kubernetes: %v", err)
	}
	l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: "sbx.dev/id=" + sb.ID})
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("pods of sandbox %s: %v, %v; want one", sb.ID, l, err)
	}
	pod := l.Items[0]
	if pod.Name == "sbx-"+sb.ID {
		t.Fatalf("sandbox %s is in a pod of its own (%s), want the claimed pool pod", sb.ID, pod.Name)
	}
	for _, ct := range pod.Spec.Containers {
		if len(ct.Env) > 0 {
			t.Errorf("claimed pod container %s holds env in its spec: %v", ct.Name, ct.Env)
		}
	}
	if res, err := sb.RunShell(ctx, `echo "$GREETING $TOKEN $SBX_SANDBOX_ID"`); err != nil || string(res.Stdout) != "hello t0k "+sb.ID+"\n" {
		t.Fatalf("env in the claimed box: %v, %+v; want %q", err, res, "hello t0k "+sb.ID+"\n")
	}

	d.stop()
	waitPods("sbx.dev/pool", 0) // the stop deleted the pool's pods
	waitPods("sbx.dev/id="+sb.ID, 1)
	d.start()
	sb2, err := d.client().Get(ctx, sb.ID)
	if err != nil {
		t.Fatalf("get after restart: %v", err)
	}
	if res, err := sb2.Run(ctx, "echo", "recovered"); err != nil || string(res.Stdout) != "recovered\n" {
		t.Fatalf("exec in the claimed box after the daemon's restart: %v, %+v", err, res)
	}
	if err := sb2.Destroy(ctx); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	waitPods("sbx.dev/id="+sb.ID, 0)
}
