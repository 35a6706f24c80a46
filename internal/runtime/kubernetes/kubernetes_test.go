package kubernetes_test

import (
	"context"
	"log/slog"
	"maps"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/kubernetes"
	"github.com/sbxdev/sbx/internal/runtime/kubernetes/k8stest"
	"github.com/sbxdev/sbx/internal/runtime/testsuite"
)

// newDriverFunc returns a NewDriver for the suite: drivers over one test
// namespace (a restarted daemon gets a new driver over the same pods).
func newDriverFunc(t *testing.T, class string) func(t *testing.T) runtime.Driver {
	c := k8stest.Get(t)
	ns := c.Namespace(t, "sbx-k8sdrv")
	img := c.AgentImage(t)
	c.EnsurePyImage(t)
	return func(t *testing.T) runtime.Driver {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		d, err := kubernetes.New(ctx, kubernetes.Config{
			Client: c.Client, Namespace: ns, AgentImage: img, RuntimeClass: class, Firewall: firewallFor(class),
			PullPolicy: corev1.PullNever, UserNamespaces: false, Logger: testLogger(),
		})
		if err != nil {
			t.Fatalf("kubernetes.New: %v", err)
		}
		if info := d.Info(ctx); !info.Healthy {
			t.Fatalf("driver unhealthy: %s", info.Detail)
		}
		return d
	}
}

// TestCreateUnschedulableLeavesNothing: a create whose pod the cluster
// cannot schedule (more CPU than the node has) fails when its context ends,
// after the driver's per-call API timeout (60 s), and still leaves no pod
// and no Secret. Before, the rollback ran on a context whose 60 s had
// started with the create: both objects stayed (seen under load, when
// other tests held the node's CPU).
func TestCreateUnschedulableLeavesNothing(t *testing.T) {
	d := newDriverFunc(t, "")(t)
	spec := withImage(testsuite.NewSpec("unschedulable"))
	spec.Resources.CPUMillis = 64000
	ctx, cancel := context.WithTimeout(context.Background(), 65*time.Second)
	defer cancel()
	h, err := d.Create(ctx, spec)
	if err == nil {
		_ = d.Destroy(context.Background(), h)
		t.Fatalf("creating a box needing 64 CPUs: got a box, want the create to fail")
	}
	t.Logf("create: %v", err)
	left, err := d.(*kubernetes.Driver).Leftovers(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("after the failed create: leftovers %v, want none", left)
	}
}

// firewallFor is the pod firewall's backend for the test cluster's
// RuntimeClass class: iptables for gvisor (runsc), else nftables.
func firewallFor(class string) string {
	if class == "gvisor" {
		return "iptables"
	}
	return "nftables"
}

// podImage is the suite's image: preloaded busybox + python3. The daemon
// hands every driver the layers it unpacked; the kubernetes driver runs
// the reference and never reads them, so the dir is a stand-in.
var podImage = &runtime.Image{Ref: k8stest.PyImage, Layers: []runtime.Layer{{Dir: "/unused-by-kubernetes"}}}

// knownGaps are the suite's checks the kubernetes driver fails, and why.
var knownGaps = map[string]string{
	"NoHostServices": "pods keep eth0 (the suite wants only lo); mode none is enforced on it by the in-pod firewall, which TestNetworkNoneAttack attacks",
	"HostProcessesConfined": "runc pods run as host root without a user namespace unless the cluster runs them with hostUsers: false (Config.UserNamespaces), " +
		"which needs runc >= 1.2 with idmapped mounts; the test node has runc 1.1.5",
}

func TestConformance(t *testing.T) {
	testsuite.Run(t, testsuite.Config{NewDriver: newDriverFunc(t, ""), Image: podImage, Skip: knownGaps})
}

// TestConformanceGvisor runs the suite on pods of RuntimeClass gvisor
// (runsc), where the cluster has it.
func TestConformanceGvisor(t *testing.T) {
	c := k8stest.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Client.NodeV1().RuntimeClasses().Get(ctx, "gvisor", metav1.GetOptions{}); err != nil {
		t.Skipf("no RuntimeClass gvisor on the test cluster: %v", err)
	}
	gaps := maps.Clone(knownGaps)
	gaps["MemoryBound"] = "FOUND by this suite, not explained yet: in a gvisor pod with a 128 MiB memory limit a 512 MiB hog allocates " +
		"and completes (the runsc sandbox process is in the pod's memory cgroup, limit 128 MiB; no swap); runc pods OOM-kill it"
	testsuite.Run(t, testsuite.Config{NewDriver: newDriverFunc(t, "gvisor"), Image: podImage, Skip: gaps})
}

// testLogger logs at debug level (Create's phase timings) with
// SBX_K8S_DEBUG set, else at the default level.
func testLogger() *slog.Logger {
	if os.Getenv("SBX_K8S_DEBUG") == "" {
		return slog.Default()
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
