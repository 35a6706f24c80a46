package kubernetes

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/sbxdev/sbx/internal/agent"
	"github.com/sbxdev/sbx/internal/runtime"
)

// Labels and annotations on what the driver makes. Labels select (cleanup,
// leftovers, operators' kubectl); annotations carry the sandbox's
// description, which need not be a valid label value.
const (
	labelManagedBy = "app.kubernetes.io/managed-by"
	labelRuntime   = "sbx.dev/runtime"
	labelInstance  = "sbx.dev/instance"
	labelID        = "sbx.dev/id"
	labelName      = "sbx.dev/name"
	labelTenant    = "sbx.dev/tenant"

	annoName    = "sbx.dev/name"
	annoTenant  = "sbx.dev/tenant"
	annoLabels  = "sbx.dev/labels"
	annoExpires = "sbx.dev/expires"
	annoImage   = "sbx.dev/image-digest"
)

// The agent's ports in the pod: its Connect API and the framed exec
// protocol, both TLS (see tls.go).
const (
	apiPort  = 7700
	execPort = 7701
)

// Paths in the pods. The init container mounts the agent emptyDir at
// initBin, the run emptyDir at initRun and the Secret at initTLS; the box
// container mounts the agent emptyDir read-only at /.sbx (the agent binary
// at /.sbx/sbx-agent, as on every runtime) and the run emptyDir at
// /.sbx/run, where the agent reads and removes its TLS files.
const (
	initBin = "/sbx/bin"
	initRun = "/sbx/run"
	initTLS = "/sbx/tls"
	boxTLS  = "/.sbx/run/tls"
)

var idRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$`)

// dockerCaps is Docker's default capability set without NET_RAW: what
// user code holds on every sbx runtime.
var dockerCaps = []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
	"SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "AUDIT_WRITE", "SETFCAP"}

func types(uid string) ktypes.UID { return ktypes.UID(uid) }

// selector selects everything this driver (runtime name and instance) made.
func (d *Driver) selector() string {
	return fmt.Sprintf("%s=sbx,%s=%s,%s=%s", labelManagedBy, labelRuntime, d.cfg.Name, labelInstance, d.cfg.Instance)
}

// meta is the object metadata of the box's pod and Secret.
func (d *Driver) meta(name string, spec runtime.Spec) metav1.ObjectMeta {
	labels := map[string]string{
		labelManagedBy: "sbx", labelRuntime: d.cfg.Name, labelInstance: d.cfg.Instance, labelID: spec.ID,
	}
	annos := map[string]string{}
	m := spec.Meta
	if m.Name != "" {
		annos[annoName] = m.Name
		if len(validation.IsValidLabelValue(m.Name)) == 0 {
			labels[labelName] = m.Name
		}
	}
	if m.Tenant != "" {
		annos[annoTenant] = m.Tenant
		if len(validation.IsValidLabelValue(m.Tenant)) == 0 {
			labels[labelTenant] = m.Tenant
		}
	}
	if len(m.Labels) > 0 {
		b, _ := json.Marshal(m.Labels)
		annos[annoLabels] = string(b)
	}
	if !m.Expires.IsZero() {
		annos[annoExpires] = m.Expires.UTC().Format(time.RFC3339)
	}
	if spec.Image.Digest != "" {
		annos[annoImage] = spec.Image.Digest
	}
	return metav1.ObjectMeta{Name: name, Namespace: d.cfg.Namespace, Labels: labels, Annotations: annos}
}

// secret is the box's TLS material for its init container.
func (d *Driver) secret(spec runtime.Spec, box *boxCert) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: d.meta(secretName(spec.ID), spec),
		Type:       corev1.SecretTypeOpaque,
		Data: map[string][]byte{
			agent.TLSAgentCert:   box.certPEM,
			agent.TLSAgentKey:    box.keyPEM,
			agent.TLSDaemonCerts: d.id.certPEM,
		},
	}
}

// pod is the box's pod: an init container that installs the agent and
// its TLS files, then the box container with the agent as PID 1.
func (d *Driver) pod(spec runtime.Spec) *corev1.Pod {
	f := false
	zero, grace, secretMode := int64(0), int64(1), int32(0o400)
	args := []string{
		"--listen", "tls:0.0.0.0:" + strconv.Itoa(apiPort),
		"--exec", "tls:0.0.0.0:" + strconv.Itoa(execPort),
		"--tls-dir", boxTLS,
		"--seccomp",
	}
	if len(spec.Command) > 0 {
		args = append(append(args, "--"), spec.Command...)
	}
	env := make([]corev1.EnvVar, 0, len(spec.Env))
	for _, kv := range spec.Env {
		k, v, _ := strings.Cut(kv, "=")
		env = append(env, corev1.EnvVar{Name: k, Value: v})
	}
	res := corev1.ResourceRequirements{Limits: corev1.ResourceList{}, Requests: corev1.ResourceList{}}
	if r := spec.Resources; r.MemoryBytes > 0 {
		q := *resource.NewQuantity(r.MemoryBytes, resource.BinarySI)
		res.Limits[corev1.ResourceMemory], res.Requests[corev1.ResourceMemory] = q, q
	}
	if r := spec.Resources; r.CPUMillis > 0 {
		q := *resource.NewMilliQuantity(r.CPUMillis, resource.DecimalSI)
		res.Limits[corev1.ResourceCPU], res.Requests[corev1.ResourceCPU] = q, q
	}
	if r := spec.Resources; r.DiskBytes > 0 {
		q := *resource.NewQuantity(r.DiskBytes, resource.BinarySI)
		res.Limits[corev1.ResourceEphemeralStorage] = q
	}
	hostname := spec.Hostname
	if hostname == "" || len(validation.IsDNS1123Label(hostname)) > 0 {
		hostname = spec.ID
	}
	workdir := spec.Workdir
	if workdir == "" {
		workdir = "/"
	}
	p := &corev1.Pod{
		ObjectMeta: d.meta(podName(spec.ID), spec),
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			AutomountServiceAccountToken:  &f, // user code gets no API credentials
			EnableServiceLinks:            &f,
			Hostname:                      hostname,
			DNSPolicy:                     corev1.DNSDefault,
			SecurityContext: &corev1.PodSecurityContext{
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Volumes: []corev1.Volume{
				{Name: "sbx-agent", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: resource.NewQuantity(64<<20, resource.BinarySI)}}},
				{Name: "sbx-run", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: resource.NewQuantity(1<<20, resource.BinarySI)}}},
				{Name: "sbx-tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secretName(spec.ID), DefaultMode: &secretMode}}},
			},
			InitContainers: []corev1.Container{d.firewallContainer(spec), {
				Name:            "sbx-install",
				Image:           d.cfg.AgentImage,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         []string{"/sbx-agent", agent.InstallArg, initBin, initTLS, initRun + "/tls"},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "sbx-agent", MountPath: initBin},
					{Name: "sbx-run", MountPath: initRun},
					{Name: "sbx-tls", MountPath: initTLS, ReadOnly: true},
				},
				SecurityContext: &corev1.SecurityContext{
					RunAsUser:                &zero,
					AllowPrivilegeEscalation: &f,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"DAC_OVERRIDE"}},
				},
			}},
			Containers: []corev1.Container{{
				Name:            "box",
				Image:           spec.Image.Ref,
				ImagePullPolicy: d.cfg.PullPolicy,
				Command:         append([]string{"/.sbx/sbx-agent"}, args...),
				WorkingDir:      workdir,
				Env:             env,
				Resources:       res,
				VolumeMounts: []corev1.VolumeMount{
					{Name: "sbx-agent", MountPath: "/.sbx", ReadOnly: true},
					{Name: "sbx-run", MountPath: "/.sbx/run"},
				},
				SecurityContext: &corev1.SecurityContext{
					RunAsUser:                &zero,
					RunAsNonRoot:             &f,
					AllowPrivilegeEscalation: &f,
					Privileged:               &f,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: dockerCaps},
				},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
		},
	}
	if d.cfg.RuntimeClass != "" {
		p.Spec.RuntimeClassName = &d.cfg.RuntimeClass
	}
	if d.cfg.UserNamespaces {
		p.Spec.HostUsers = &f
	}
	return p
}
