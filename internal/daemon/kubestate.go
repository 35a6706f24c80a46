package daemon

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/sandbox"
	"github.com/sbxdev/sbx/internal/store/kubestore"
)

// Where the daemon keeps its sandbox records (Config.State).
const (
	// StateSQLite is the default: a SQLite file in the data dir, for one
	// daemon.
	StateSQLite = "sqlite"
	// StateKubernetes keeps them in the Kubernetes API
	// (internal/store/kubestore), so that replicas behind one address
	// serve every sandbox and a replica may die at any point.
	StateKubernetes = "kubernetes"
)

// hostLocal are the runtimes whose boxes live on the daemon's own host
// (processes, cgroups and files there): another replica could not reach
// them, so they are left out of a daemon with shared state.
var hostLocal = map[string]bool{"oci": true, "gvisor": true}

var _ sandbox.SharedStore = (*kubestore.Store)(nil)

// sharedState opens the Kubernetes state store for --state kubernetes and
// returns the runtimes a replica may use with it (those whose boxes any
// replica reaches: the kubernetes runtimes). A default runtime local to
// this host is refused, naming the reason.
func sharedState(ctx context.Context, cfg Config, drivers map[string]runtime.Driver, defaultRuntime string) (*kubestore.Store, map[string]runtime.Driver, error) {
	if hostLocal[defaultRuntime] {
		return nil, nil, fmt.Errorf("--state kubernetes: runtime %q keeps its sandboxes on this host, where another replica cannot reach them; use --default-runtime kubernetes: %w", defaultRuntime, errdefs.ErrInvalidArgument)
	}
	shared := map[string]runtime.Driver{}
	for name, d := range drivers {
		if !hostLocal[name] {
			shared[name] = d
		}
	}
	if len(shared) == 0 {
		return nil, nil, fmt.Errorf("--state kubernetes needs the kubernetes runtime (--k8s-namespace and --k8s-agent-image): %w", errdefs.ErrInvalidArgument)
	}
	ns := cfg.StateNamespace
	if ns == "" {
		ns = cfg.Kubernetes.Namespace
	}
	if ns == "" {
		return nil, nil, fmt.Errorf("--state kubernetes needs a namespace (--state-namespace or --k8s-namespace): %w", errdefs.ErrInvalidArgument)
	}
	rc, err := kubeRESTConfig(cfg.Kubernetes.Kubeconfig)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes state: %w", err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes state: %w", err)
	}
	st, err := kubestore.New(cs, ns)
	if err != nil {
		return nil, nil, err
	}
	if err := st.Check(ctx); err != nil {
		return nil, nil, fmt.Errorf("kubernetes state (runtimes %v): %w", slices.Sorted(maps.Keys(shared)), err)
	}
	return st, shared, nil
}

// kubeRESTConfig is loadKubeConfig with the API's rate limits raised from
// client-go's 5/s: every lookup of a replica reads a record.
func kubeRESTConfig(path string) (*rest.Config, error) {
	rc, err := loadKubeConfig(path)
	if err != nil {
		return nil, err
	}
	rc.QPS, rc.Burst = 200, 400
	return rc, nil
}

// loadKubeConfig loads the kubeconfig at path, or the in-cluster service
// account when path is "".
func loadKubeConfig(path string) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if path != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", path)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("loading credentials: %w", err)
	}
	return rc, nil
}
