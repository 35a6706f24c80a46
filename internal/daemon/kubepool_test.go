package daemon

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
	k8sdriver "github.com/sbxdev/sbx/internal/runtime/kubernetes"
)

func TestK8sWarmPools(t *testing.T) {
	lim := runtime.Resources{MemoryBytes: 512 << 20, CPUMillis: 1000, Pids: 512, DiskBytes: 1 << 30}
	runtimes := map[string]string{"kubernetes": "", "kubernetes-gvisor": "gvisor"}
	for _, tc := range []struct {
		name   string
		values []string
		want   map[string][]k8sdriver.PoolSpec
		err    string // in the error, which wraps ErrInvalidArgument
	}{
		{name: "none", want: map[string][]k8sdriver.PoolSpec{}},
		{name: "default runtime", values: []string{"reg.local/py:3.12=4"},
			want: map[string][]k8sdriver.PoolSpec{"kubernetes": {{Image: "reg.local/py:3.12", Resources: lim, Size: 4}}}},
		{name: "named runtime", values: []string{"kubernetes-gvisor=py@sha256:ab=2", "py=0"},
			want: map[string][]k8sdriver.PoolSpec{"kubernetes-gvisor": {{Image: "py@sha256:ab", Resources: lim, Size: 2}}, "kubernetes": {{Image: "py", Resources: lim, Size: 0}}}},
		{name: "no count", values: []string{"py"}, err: `"py": want [RUNTIME=]IMAGE=N`},
		{name: "no image", values: []string{"=3"}, err: `"=3": want [RUNTIME=]IMAGE=N`},
		{name: "bad count", values: []string{"py=-1"}, err: `"-1" is not a count of pods`},
		{name: "unknown runtime", values: []string{"oci=py=1"}, err: `"oci" is not a kubernetes runtime`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := k8sWarmPools(tc.values, runtimes, lim)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("got error %v, want InvalidArgument containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("got error %v, want none", err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("pools (-want +got):\n%s", d)
			}
		})
	}
}

// TestK8sFirewallUnknownRuntime: --k8s-firewall naming no kubernetes
// runtime is refused, naming it and the runtimes there are, before any
// cluster is reached.
func TestK8sFirewallUnknownRuntime(t *testing.T) {
	kc := KubernetesConfig{Namespace: "ns", AgentImage: "agent", Kubeconfig: "/nonexistent",
		RuntimeClasses: map[string]string{"kubernetes-gvisor": "gvisor"},
		Firewalls:      map[string]string{"kubernetes-gvisr": "iptables"}}
	err := addKubernetes(t.Context(), kc, runtime.Resources{}, map[string]runtime.Driver{}, nil)
	if err == nil || !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "--k8s-firewall kubernetes-gvisr") ||
		!strings.Contains(err.Error(), "[kubernetes kubernetes-gvisor]") {
		t.Fatalf("addKubernetes: got %v, want InvalidArgument naming kubernetes-gvisr and the runtimes", err)
	}
}

func TestClusterCIDRs(t *testing.T) {
	got, err := clusterCIDRs([]string{"10.244.0.0/16", "192.0.2.7", "10.96.1.2/12"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "[10.244.0.0/16 192.0.2.7/32 10.96.0.0/12]"; fmt.Sprint(got) != want {
		t.Errorf("clusterCIDRs: got %v, want %s", got, want)
	}
	for _, bad := range []string{"x", "fd00::/8", "10.0.0.0/33"} {
		if _, err := clusterCIDRs([]string{bad}); err == nil || !strings.Contains(err.Error(), bad) || !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("clusterCIDRs(%q): got %v, want InvalidArgument naming it", bad, err)
		}
	}
}
