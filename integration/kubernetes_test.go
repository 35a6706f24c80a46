package integration

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sbxdev/sbx/internal/runtime/kubernetes/k8stest"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestKubernetesRuntime drives a daemon with the kubernetes runtime on the
// test cluster (make test-k8s): `sbx version` lists it healthy; a create
// with runtime=kubernetes makes a labelled pod whose agent runs the
// commands; what the runtime lacks (stop, network modes public and allow)
// is refused naming the runtime and the capability; a daemon killed with -9 recovers the sandbox; destroy
// removes the pod.
func TestKubernetesRuntime(t *testing.T) {
	c := k8stest.Get(t)
	ns := c.Namespace(t, "sbx-k8s-e2e")
	agentImg := c.AgentImage(t)
	img := c.EnsurePyImage(t)
	d := startDaemon(t, "--k8s-namespace", ns, "--k8s-kubeconfig", filepath.Join(c.Dir, "pki", "admin.kubeconfig"),
		"--k8s-agent-image", agentImg)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	out, _, code := d.cli("", "version")
	if code != 0 || !strings.Contains(out, "runtime kubernetes: healthy: pods in namespace "+ns) {
		t.Fatalf("sbx version: exit %d\n%s\nwant the kubernetes runtime listed healthy", code, out)
	}
	// The daemon reads the image's config from its own store; the cluster
	// runs the same reference, preloaded on the node.
	if out, errOut, code := d.cli("", "images", "import", "--use-archive-tags", filepath.Join(c.Dir, "images", "pybox.tar")); code != 0 {
		t.Fatalf("sbx images import: exit %d: %s %s", code, out, errOut)
	}
	cl := d.client()
	sb, err := cl.Create(ctx, sbx.CreateOptions{Image: img, Runtime: "kubernetes", Name: "k8s-box", Labels: map[string]string{"team": "infra"}})
	if err != nil {
		t.Fatalf("create on kubernetes: %v", err)
	}
	res, err := sb.RunShell(ctx, "echo hi; tr '\\0' ' ' < /proc/1/cmdline")
	if err != nil || !strings.HasPrefix(string(res.Stdout), "hi\n/.sbx/sbx-agent ") {
		t.Fatalf("exec in the pod: %v, %+v; want hi and the agent as pid 1", err, res)
	}
	pod, err := c.Client.CoreV1().Pods(ns).Get(ctx, "sbx-"+sb.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the sandbox's pod: %v", err)
	}
	for k, want := range map[string]string{"sbx.dev/id": sb.ID, "sbx.dev/name": "k8s-box", "app.kubernetes.io/managed-by": "sbx"} {
		if got := pod.Labels[k]; got != want {
			t.Errorf("pod label %s = %q, want %q", k, got, want)
		}
	}
	if got := pod.Annotations["sbx.dev/labels"]; got != `{"team":"infra"}` {
		t.Errorf("pod annotation sbx.dev/labels = %q, want the sandbox's labels", got)
	}
	if _, ok := pod.Annotations["sbx.dev/expires"]; !ok {
		t.Errorf("pod annotations %v lack sbx.dev/expires", pod.Annotations)
	}
	var ce *connect.Error
	if err := sb.Stop(ctx); !errors.As(err, &ce) || ce.Code() != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), `"pause" capability`) {
		t.Errorf("stop on kubernetes: %v, want FailedPrecondition naming the pause capability", err)
	}
	// What its pods cannot enforce is refused, not run as none (or open):
	// allow-listed names (they need the daemon's DNS forwarder), domain
	// secrets, and changing a created box's policy.
	for _, opts := range []sbx.CreateOptions{
		{Network: &sbx.NetworkPolicy{Mode: "allow", AllowDomains: []string{"example.com"}}},
		{DomainSecrets: []sbx.DomainSecret{{Name: "K", Value: "v", Domains: []string{"example.com"}}}},
	} {
		opts.Image, opts.Runtime = img, "kubernetes"
		_, err := cl.Create(ctx, opts)
		if !errors.As(err, &ce) || ce.Code() != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), `"network" capability`) {
			t.Errorf("create on kubernetes with %+v: %v, want FailedPrecondition naming the network capability", opts, err)
		}
	}
	if err := sb.UpdateNetwork(ctx, sbx.NetworkPolicy{Mode: "public"}); !errors.As(err, &ce) || ce.Code() != connect.CodeFailedPrecondition {
		t.Errorf("changing the network of a kubernetes box: %v, want FailedPrecondition", err)
	}
	if pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("listing pods: %v", err)
	} else if len(pods.Items) != 1 {
		t.Errorf("pods after the refused creates: %d, want only the sandbox's", len(pods.Items))
	}
	// An allow-listed box's policy reaches its pod's firewall (the attack
	// tests in internal/runtime/kubernetes prove what it enforces).
	allowed, err := cl.Create(ctx, sbx.CreateOptions{Image: img, Runtime: "kubernetes",
		Network: &sbx.NetworkPolicy{Mode: "allow", AllowCIDRs: []string{"203.0.113.7"}, DenyCIDRs: []string{"203.0.113.8/32"}}})
	if err != nil {
		t.Fatalf("create on kubernetes in mode allow: %v", err)
	}
	if apod, err := c.Client.CoreV1().Pods(ns).Get(ctx, "sbx-"+allowed.ID, metav1.GetOptions{}); err != nil {
		t.Errorf("the allow-listed sandbox's pod: %v", err)
	} else if got := strings.Join(apod.Spec.InitContainers[0].Command, " "); !strings.Contains(got, "sbx-firewall nftables allow -deny 203.0.113.8/32 ") ||
		!strings.Contains(got, "-allow 203.0.113.7/32 ") {
		t.Errorf("the allow-listed sandbox's firewall: %q, want mode allow with its deny and allow CIDRs", got)
	}
	if err := allowed.Destroy(ctx); err != nil {
		t.Errorf("destroy: %v", err)
	}

	d.kill9()
	d.start()
	sb2, err := d.client().Get(ctx, sb.ID)
	if err != nil {
		t.Fatalf("get after kill -9: %v", err)
	}
	if res, err := sb2.Run(ctx, "echo", "recovered"); err != nil || string(res.Stdout) != "recovered\n" {
		t.Fatalf("exec after the daemon's restart: %v, %+v", err, res)
	}
	if err := sb2.Destroy(ctx); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	for {
		_, err := c.Client.CoreV1().Pods(ns).Get(ctx, "sbx-"+sb.ID, metav1.GetOptions{})
		if err != nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pod sbx-%s still there after destroy", sb.ID)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
