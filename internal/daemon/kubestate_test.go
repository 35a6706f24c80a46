package daemon

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/kubernetes/k8stest"
)

// TestSharedStateRefusals: --state kubernetes is refused, naming why, for a
// host-local default runtime, without a kubernetes runtime, without a
// namespace, and with credentials that do not load.
func TestSharedStateRefusals(t *testing.T) {
	local := map[string]runtime.Driver{"oci": nil, "gvisor": nil}
	withK8s := map[string]runtime.Driver{"oci": nil, "gvisor": nil, "kubernetes": nil}
	tests := []struct {
		name    string
		cfg     Config
		drivers map[string]runtime.Driver
		def     string
		want    string
		invalid bool
	}{
		{"default oci", Config{}, withK8s, "oci", `runtime "oci" keeps its sandboxes on this host`, true},
		{"default gvisor", Config{}, withK8s, "gvisor", `runtime "gvisor" keeps its sandboxes on this host`, true},
		{"no kubernetes runtime", Config{}, local, "kubernetes", "needs the kubernetes runtime", true},
		{"no namespace", Config{}, withK8s, "kubernetes", "needs a namespace", true},
		{"credentials missing", Config{StateNamespace: "sbx", Kubernetes: KubernetesConfig{Kubeconfig: "/nonexistent/kubeconfig"}},
			withK8s, "kubernetes", "loading credentials", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := sharedState(context.Background(), tc.cfg, tc.drivers, tc.def)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
			if got := errdefs.IsInvalidArgument(err); got != tc.invalid {
				t.Errorf("invalid argument: got %v, want %v (%v)", got, tc.invalid, err)
			}
		})
	}
}

// TestSharedStateKeepsSharedRuntimes: on the test cluster, the store opens
// and only the runtimes every replica reaches are kept.
func TestSharedStateKeepsSharedRuntimes(t *testing.T) {
	c := k8stest.Get(t)
	ns := c.Namespace(t, "sbx-state")
	cfg := Config{Kubernetes: KubernetesConfig{Namespace: ns, Kubeconfig: filepath.Join(c.Dir, "pki", "admin.kubeconfig")}}
	drivers := map[string]runtime.Driver{"oci": nil, "gvisor": nil, "kubernetes": nil, "kubernetes-gvisor": nil}
	st, got, err := sharedState(context.Background(), cfg, drivers, "kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	if st == nil {
		t.Fatal("no store returned")
	}
	if names, want := slices.Sorted(maps.Keys(got)), []string{"kubernetes", "kubernetes-gvisor"}; !slices.Equal(names, want) {
		t.Errorf("runtimes kept: got %v, want %v", names, want)
	}
}
