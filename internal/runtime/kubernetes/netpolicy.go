package kubernetes

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sbxdev/sbx/internal/network"
	"github.com/sbxdev/sbx/internal/podfw"
	"github.com/sbxdev/sbx/internal/runtime"
)

// firewallContainer is the pod's first init container: the agent binary
// as `sbx-agent sbx-firewall BACKEND MODE [FLAG CIDR]... 7700 7701`,
// which programs the pod's firewall (package podfw) before anything else
// in the pod runs. It alone holds NET_ADMIN (and, for the iptables
// backend, NET_RAW: the x_tables setsockopts go through a raw socket); the
// box container holds neither, so box root cannot undo the rules. This
// holds on any CNI, enforcing NetworkPolicy or not (the test cluster's
// bridge CNI does not). The backend is Config.Firewall: nftables in the
// pod's netns (runc), or iptables in gVisor's netstack, which the init
// container shares with the box as one runsc sandbox (mode none only: the
// driver does not declare runtime.CapPodNetwork then). See firewallRules
// for what each mode lets through.
func (d *Driver) firewallContainer(spec runtime.Spec) corev1.Container {
	f := false
	zero := int64(0)
	caps := []corev1.Capability{"NET_ADMIN"}
	if d.cfg.Firewall == podfw.BackendIPTables {
		caps = append(caps, "NET_RAW")
	}
	return corev1.Container{
		Name:            firewallName,
		Image:           d.cfg.AgentImage,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Command:         append([]string{"/sbx-agent", podfw.Arg}, d.firewallRules(spec).Args()...),
		// The node's address, which the connected modes never reach.
		Env: []corev1.EnvVar{{Name: podfw.EnvNodeIP, ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}}},
		SecurityContext: &corev1.SecurityContext{
			RunAsUser:                &zero,
			AllowPrivilegeEscalation: &f,
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: caps},
		},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
}

// firewallName is the firewall init container's name.
const firewallName = "sbx-firewall"

// firewallRules is spec's network as the pod firewall's rules. No
// Network: mode none (loopback and the agent's ports in, nothing out). A
// pod policy (runtime.PodNetwork) keeps that and lets out, in order: never
// its Deny; DNS to the pod's nameservers (public only); never the cluster
// (Config.ClusterCIDRs, and what the pod finds itself: its node, its
// networks and gateways, the API server's ClusterIP); its Allow; in
// public mode anything but the ranges oci's public mode blocks
// (network.BlockedRanges). So an allow-list cannot open the cluster, as
// on oci it cannot open the host.
func (d *Driver) firewallRules(spec runtime.Spec) podfw.Rules {
	r := podfw.Rules{Backend: d.cfg.Firewall, Mode: podfw.ModeNone, AgentPorts: []uint16{apiPort, execPort}}
	if spec.Network == nil || spec.Network.Pod == nil {
		return r
	}
	pn := spec.Network.Pod
	r.Mode = podfw.ModeAllow
	if pn.Mode == runtime.PodPublic {
		r.Mode = podfw.ModePublic
		r.Blocked = network.BlockedRanges()
	}
	r.Deny = slices.Clone(pn.Deny)
	r.Allow = slices.Clone(pn.Allow)
	r.Never = slices.Clone(d.cfg.ClusterCIDRs)
	return r
}

// networkPolicyName is the NetworkPolicy of a runtime's (name, instance)
// pods.
func networkPolicyName(runtimeName, instance string) string {
	return "sbx-" + runtimeName + "-" + instance + "-none"
}

// networkPolicy is mode none as a NetworkPolicy, for clusters whose CNI
// enforces it (the pod firewall holds on every cluster; this adds the
// CNI's enforcement outside the pod where there is one): it selects this
// runtime's pods (as selector does), admits TCP to the agent's ports from
// anywhere (the daemon's address is not known here; the agent
// authenticates it) and lets them send nothing.
func (d *Driver) networkPolicy() *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	api, exec := intstr.FromInt32(apiPort), intstr.FromInt32(execPort)
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{
			Name: networkPolicyName(d.cfg.Name, d.cfg.Instance), Namespace: d.cfg.Namespace,
			Labels: map[string]string{labelManagedBy: "sbx", labelRuntime: d.cfg.Name, labelInstance: d.cfg.Instance},
		},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{
				labelManagedBy: "sbx", labelRuntime: d.cfg.Name, labelInstance: d.cfg.Instance,
			}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{
				{Protocol: &tcp, Port: &api}, {Protocol: &tcp, Port: &exec},
			}}},
			Egress: []networkingv1.NetworkPolicyEgressRule{},
		},
	}
}

// ensureNetworkPolicy makes (or corrects) the runtime's NetworkPolicy.
func (d *Driver) ensureNetworkPolicy(ctx context.Context) error {
	want := d.networkPolicy()
	api := d.client.NetworkingV1().NetworkPolicies(d.cfg.Namespace)
	_, err := api.Create(ctx, want, metav1.CreateOptions{})
	if err == nil {
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating network policy %s: %w", want.Name, err)
	}
	got, err := api.Get(ctx, want.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading network policy %s: %w", want.Name, err)
	}
	if equality.Semantic.DeepEqual(got.Spec, want.Spec) {
		return nil
	}
	got.Spec = want.Spec
	if _, err := api.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("correcting network policy %s: %w", want.Name, err)
	}
	return nil
}

// boxPolicyName is the NetworkPolicy of box id's connected mode.
func boxPolicyName(id string) string { return "sbx-" + id + "-egress" }

// boxNetworkPolicy is box spec's pod policy (spec.Network.Pod) as a
// NetworkPolicy, for clusters whose CNI enforces it: the egress the
// runtime's policy (mode none) denies, opened for this box's pod alone
// (policies add up). It selects the pod by its box id and is owned by it
// (the garbage collector deletes it with the pod). Egress goes, as ipBlock
// rules, to 0.0.0.0/0 (public) except the blocked ranges, Deny and the
// cluster's ranges; to each Allow range not inside Deny or the cluster's
// ranges, except the parts of them it holds; and (public) to port 53 of
// anything not in Deny, since the cluster's DNS is in its service or pod
// range. nil: nothing to open (an allow-list the cluster's ranges cover).
// The pod firewall holds whatever the CNI does; this is enforcement
// outside the pod where there is some.
func (d *Driver) boxNetworkPolicy(spec runtime.Spec, pod *corev1.Pod) *networkingv1.NetworkPolicy {
	if spec.Network == nil || spec.Network.Pod == nil {
		return nil
	}
	r := d.firewallRules(spec)
	closed := network.DisjointPrefixes(slices.Concat(r.Deny, r.Never))
	var egress []networkingv1.NetworkPolicyEgressRule
	block := func(cidr netip.Prefix, except []netip.Prefix) *networkingv1.NetworkPolicyEgressRule {
		b := &networkingv1.IPBlock{CIDR: cidr.String()}
		for _, x := range except {
			if x.Bits() <= cidr.Bits() && x.Contains(cidr.Addr()) {
				return nil // all of cidr is closed
			}
			if cidr.Contains(x.Addr()) {
				b.Except = append(b.Except, x.String())
			}
		}
		return &networkingv1.NetworkPolicyEgressRule{To: []networkingv1.NetworkPolicyPeer{{IPBlock: b}}}
	}
	if r.Mode == podfw.ModePublic {
		if e := block(netip.MustParsePrefix("0.0.0.0/0"), network.DisjointPrefixes(slices.Concat(closed, r.Blocked))); e != nil {
			egress = append(egress, *e)
		}
	}
	for _, a := range network.DisjointPrefixes(r.Allow) {
		if e := block(a, closed); e != nil {
			egress = append(egress, *e)
		}
	}
	if r.Mode == podfw.ModePublic {
		if e := block(netip.MustParsePrefix("0.0.0.0/0"), network.DisjointPrefixes(r.Deny)); e != nil {
			udp, tcp, dns := corev1.ProtocolUDP, corev1.ProtocolTCP, intstr.FromInt32(53)
			e.Ports = []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &dns}, {Protocol: &tcp, Port: &dns}}
			egress = append(egress, *e)
		}
	}
	if len(egress) == 0 {
		return nil
	}
	labels := map[string]string{labelManagedBy: "sbx", labelRuntime: d.cfg.Name, labelInstance: d.cfg.Instance, labelID: spec.ID}
	yes := true
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{
			Name: boxPolicyName(spec.ID), Namespace: d.cfg.Namespace, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: &yes}},
		},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: labels},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress:      egress,
		},
	}
}

// createBoxPolicy makes box spec's NetworkPolicy for its pod, if it has
// one. A failure is logged, not returned: the pod firewall enforces the
// policy on any cluster (as for the runtime's policy, see New).
func (d *Driver) createBoxPolicy(ctx context.Context, spec runtime.Spec, pod *corev1.Pod) {
	p := d.boxNetworkPolicy(spec, pod)
	if p == nil {
		return
	}
	if _, err := d.client.NetworkingV1().NetworkPolicies(d.cfg.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		d.log.Warn("kubernetes runtime: no NetworkPolicy for a box (its pod firewall still enforces its network policy)", "box", spec.ID, "err", err)
	}
}

// deleteBoxPolicy deletes box id's NetworkPolicy (the garbage collector
// would, with its pod; this does not wait for it).
func (d *Driver) deleteBoxPolicy(ctx context.Context, id string) {
	err := d.client.NetworkingV1().NetworkPolicies(d.cfg.Namespace).Delete(ctx, boxPolicyName(id), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		d.log.Warn("deleting box network policy", "box", id, "err", err)
	}
}
