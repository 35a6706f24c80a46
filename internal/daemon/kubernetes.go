package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
	k8sdriver "github.com/sbxdev/sbx/internal/runtime/kubernetes"
)

// KubernetesConfig configures the kubernetes runtime (`sbx serve --k8s-*`).
type KubernetesConfig struct {
	// Namespace holds the sandboxes' pods; "" leaves the runtime out.
	Namespace string
	// Kubeconfig is the kubeconfig file ("" = the in-cluster service
	// account, for a daemon running as a pod).
	Kubeconfig string
	// AgentImage is the image holding the static sbx-agent at /sbx-agent.
	AgentImage string
	// RuntimeClasses maps extra runtime names to RuntimeClasses
	// ("kubernetes-gvisor" → "gvisor"); the runtime "kubernetes" uses the
	// cluster's default handler.
	RuntimeClasses map[string]string
	// Firewalls maps runtime names to their pod firewall's backend
	// ("kubernetes-gvisor" → "iptables"); unnamed runtimes use nftables.
	Firewalls map[string]string
	// Instance separates daemons sharing a namespace ("" = "default").
	Instance string
	// UserNamespaces runs pods with hostUsers: false.
	UserNamespaces bool
	// ClusterCIDRs are the cluster's own ranges (IPv4 CIDRs or
	// addresses): boxes in modes public and allow never reach them.
	ClusterCIDRs []string
	// WarmPool is the pods kept ready per image: `[RUNTIME=]IMAGE=N`
	// values (kubepool.go).
	WarmPool []string
	// PoolLease is how long a replica's warm-pool Lease lasts unrenewed
	// before the other replicas delete its unclaimed pool pods (0 = the
	// driver's default, 30 s).
	PoolLease time.Duration
}

// DefaultK8sPoolLease is KubernetesConfig.PoolLease's default.
const DefaultK8sPoolLease = k8sdriver.DefaultLeaseDuration

// addKubernetes adds the kubernetes runtimes to drivers when configured.
// A cluster that cannot be reached leaves them unhealthy (sbx info says
// why), not the daemon down.
func addKubernetes(ctx context.Context, kc KubernetesConfig, defaults runtime.Resources, drivers map[string]runtime.Driver, log *slog.Logger) error {
	if kc.Namespace == "" {
		return nil
	}
	if kc.AgentImage == "" {
		return fmt.Errorf("--k8s-namespace needs --k8s-agent-image (an image with the static sbx-agent at /sbx-agent): %w", errdefs.ErrInvalidArgument)
	}
	classes := map[string]string{k8sdriver.Name: ""}
	maps.Copy(classes, kc.RuntimeClasses)
	for name := range kc.Firewalls {
		if _, ok := classes[name]; !ok {
			return fmt.Errorf("--k8s-firewall %s: no kubernetes runtime of that name (runtimes: %v): %w",
				name, slices.Sorted(maps.Keys(classes)), errdefs.ErrInvalidArgument)
		}
	}
	cluster, err := clusterCIDRs(kc.ClusterCIDRs)
	if err != nil {
		return err
	}
	rc, err := loadKubeConfig(kc.Kubeconfig)
	if err != nil {
		return fmt.Errorf("kubernetes runtime: %w", err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("kubernetes runtime: %w", err)
	}
	pools, err := k8sWarmPools(kc.WarmPool, classes, defaults)
	if err != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(classes)) {
		if _, taken := drivers[name]; taken {
			return fmt.Errorf("kubernetes runtime %q: the name is taken by another runtime: %w", name, errdefs.ErrInvalidArgument)
		}
		d, err := k8sdriver.New(ctx, k8sdriver.Config{
			Name: name, Client: client, Namespace: kc.Namespace, AgentImage: kc.AgentImage,
			RuntimeClass: classes[name], Firewall: kc.Firewalls[name], Instance: kc.Instance, UserNamespaces: kc.UserNamespaces,
			Pool: pools[name], ClusterCIDRs: cluster, LeaseDuration: kc.PoolLease, Logger: log.With("runtime", name),
		})
		if err != nil {
			return fmt.Errorf("kubernetes runtime %q: %w", name, err)
		}
		drivers[name] = d
	}
	return nil
}

// clusterCIDRs parses --k8s-cluster-cidrs: IPv4 CIDRs or addresses.
func clusterCIDRs(in []string) ([]netip.Prefix, error) {
	var cluster []netip.Prefix
	for _, c := range in {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			a, aerr := netip.ParseAddr(c)
			if aerr != nil {
				return nil, fmt.Errorf("--k8s-cluster-cidrs %q: not a CIDR or address: %w", c, errdefs.ErrInvalidArgument)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if !p.Addr().Is4() {
			return nil, fmt.Errorf("--k8s-cluster-cidrs %q: only IPv4 (the pod firewall drops all IPv6 of boxes in a connected mode): %w", c, errdefs.ErrInvalidArgument)
		}
		cluster = append(cluster, p.Masked())
	}
	return cluster, nil
}
