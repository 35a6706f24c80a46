package kubernetes

import (
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/sbxdev/sbx/internal/podfw"
)

// firewallContainer is the pod's first init container: the agent binary
// as `sbx-agent sbx-firewall none 7700 7701`, which programs nftables in
// the pod's network namespace (package podfw) before anything else in the
// pod runs. Every box on this runtime has network mode none (the driver
// lacks runtime.CapNetwork, so the manager refuses the other modes): the
// pod keeps loopback and the agent's ports inbound, and reaches nothing.
// It alone holds NET_ADMIN; the box container never does, so box root
// cannot undo the rules. This holds on any CNI, enforcing NetworkPolicy or
// not (the test cluster's bridge CNI does not).
func (d *Driver) firewallContainer() corev1.Container {
	f := false
	zero := int64(0)
	return corev1.Container{
		Name:            "sbx-firewall",
		Image:           d.cfg.AgentImage,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Command: []string{"/sbx-agent", podfw.Arg, podfw.ModeNone,
			strconv.Itoa(apiPort), strconv.Itoa(execPort)},
		SecurityContext: &corev1.SecurityContext{
			RunAsUser:                &zero,
			AllowPrivilegeEscalation: &f,
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_ADMIN"}},
		},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
}
