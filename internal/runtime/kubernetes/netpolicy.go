package kubernetes

import (
	"context"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sbxdev/sbx/internal/podfw"
)

// firewallContainer is the pod's first init container: the agent binary
// as `sbx-agent sbx-firewall BACKEND none 7700 7701`, which programs the
// pod's firewall (package podfw) before anything else in the pod runs.
// Every box on this runtime has network mode none (the driver lacks
// runtime.CapNetwork, so the manager refuses the other modes): the pod
// keeps loopback and the agent's ports inbound, and reaches nothing. It
// alone holds NET_ADMIN (and, for the iptables backend, NET_RAW: the
// x_tables setsockopts go through a raw socket); the box container holds
// neither, so box root cannot undo the rules. This holds on any CNI,
// enforcing NetworkPolicy or not (the test cluster's bridge CNI does not).
// The backend is Config.Firewall: nftables in the pod's netns (runc), or
// iptables in gVisor's netstack, which the init container shares with the
// box as one runsc sandbox.
func (d *Driver) firewallContainer() corev1.Container {
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
		Command: []string{"/sbx-agent", podfw.Arg, d.cfg.Firewall, podfw.ModeNone,
			strconv.Itoa(apiPort), strconv.Itoa(execPort)},
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
