// Package kubernetes is the kubernetes runtime driver: one Pod per sandbox
// in a configured namespace, the static sbx-agent as the box container's
// PID 1, copied in by an init container from a tiny agent image (so any
// image runs), reached over the pod IP with mutually authenticated TLS (see
// tls.go and docs/DRIVERS.md). Only internal/daemon imports it.
package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/sbxdev/sbx/internal/cleanup"
	"github.com/sbxdev/sbx/internal/crashpoint"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/podfw"
	"github.com/sbxdev/sbx/internal/runtime"
)

// Name is the runtime's default name.
const Name = "kubernetes"

// apiTimeout bounds the API calls of a create's steps and rollback.
const apiTimeout = 60 * time.Second

// handleVersion is the version of the Data this driver writes.
const handleVersion = 1

// Config is what the daemon tells the driver.
type Config struct {
	// Name is the runtime's name ("" = "kubernetes"). A daemon may run one
	// driver per RuntimeClass ("kubernetes-gvisor"); each labels and cleans
	// up only its own pods.
	Name string
	// Client talks to the API server.
	Client k8s.Interface
	// Namespace holds the sandboxes' pods (and their short-lived Secrets).
	Namespace string
	// AgentImage is the image of the init container that installs
	// sbx-agent (a static binary at /sbx-agent); the daemon's own build.
	AgentImage string
	// RuntimeClass is the pods' runtimeClassName ("" = the cluster's
	// default handler).
	RuntimeClass string
	// Firewall is the pod firewall's backend (podfw): "nftables" (the
	// default) for runtimes sharing the node's kernel, "iptables" for
	// gVisor (runsc's netstack has no nftables; runsc needs --net-raw,
	// docs/DRIVERS.md). A gVisor class left on nftables fails closed: its
	// creates fail, naming the firewall's error.
	Firewall string
	// Instance separates daemons sharing a namespace: each labels its pods
	// with it and cleans up only those ("" = "default"). Replicas of one
	// daemon share it.
	Instance string
	// UserNamespaces runs pods with hostUsers: false (box root is not host
	// root), where the cluster supports it.
	UserNamespaces bool
	// PullPolicy of the box's image ("" = IfNotPresent).
	PullPolicy corev1.PullPolicy
	// Pool is the warm pool: pods started ahead per image and limits, which
	// a matching Create claims (warmpool.go). Start it with StartPool.
	Pool []PoolSpec
	// ClusterCIDRs are the cluster's own ranges (pods, services, nodes):
	// boxes in a connected mode never reach them, whatever their
	// allow-list says. The pod firewall adds what each pod finds itself
	// (its node, its own network, the API server's ClusterIP).
	ClusterCIDRs []netip.Prefix
	// LeaseDuration is how long a pool owner's Lease lasts unrenewed
	// before other processes delete its unclaimed pool pods (lease.go;
	// 0 = DefaultLeaseDuration).
	LeaseDuration time.Duration
	Logger        *slog.Logger
}

// Driver is the kubernetes runtime driver.
type Driver struct {
	cfg    Config
	client k8s.Interface
	id     *identity
	log    *slog.Logger
	health string   // "" when healthy
	pool   *pool    // nil without Config.Pool
	sweep  *sweeper // nil until StartPool
	netpol string   // why the NetworkPolicy was not made ("" = it was)

	// fwMu guards fwFailed: the pod firewall's error in the last pod that
	// ran it ("" once a pod's firewall succeeds), for Info.
	fwMu     sync.Mutex
	fwFailed string
}

// handleData is what a Handle carries (version 1). All of it is public:
// the pod and the box's certificate pin; the daemon's key lives in the
// namespace's identity Secret.
type handleData struct {
	V         int    `json:"v"`
	Namespace string `json:"ns"`
	Pod       string `json:"pod"`
	UID       string `json:"uid"`
	// IP is the pod's IP, where the agent listens.
	IP string `json:"ip"`
	// AgentCert is the SHA-256 of the box's agent certificate (DER, hex).
	AgentCert string `json:"agentCert"`
}

// New returns the driver. It reaches the API server to load (or create)
// the daemon's identity; a cluster it cannot reach leaves the driver
// unhealthy (Info says why) rather than failing the daemon.
func New(ctx context.Context, cfg Config) (*Driver, error) {
	if cfg.Name == "" {
		cfg.Name = Name
	}
	if cfg.Instance == "" {
		cfg.Instance = "default"
	}
	if cfg.PullPolicy == "" {
		cfg.PullPolicy = corev1.PullIfNotPresent
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = DefaultLeaseDuration
	}
	if cfg.LeaseDuration < 3*time.Second {
		return nil, fmt.Errorf("kubernetes runtime: a pool lease of %v: want at least 3s (it is renewed every third): %w", cfg.LeaseDuration, errdefs.ErrInvalidArgument)
	}
	if cfg.Client == nil || cfg.Namespace == "" || cfg.AgentImage == "" {
		return nil, fmt.Errorf("kubernetes runtime: need a client, a namespace and an agent image: %w", errdefs.ErrInvalidArgument)
	}
	switch cfg.Firewall {
	case "":
		cfg.Firewall = podfw.BackendNFTables
	case podfw.BackendNFTables, podfw.BackendIPTables:
	default:
		return nil, fmt.Errorf("kubernetes runtime %s: firewall backend %q: want %q or %q: %w",
			cfg.Name, cfg.Firewall, podfw.BackendNFTables, podfw.BackendIPTables, errdefs.ErrInvalidArgument)
	}
	if len(cfg.ClusterCIDRs) > runtime.MaxPodNetworkEntries {
		return nil, fmt.Errorf("kubernetes runtime: %d cluster CIDRs, at most %d: %w", len(cfg.ClusterCIDRs), runtime.MaxPodNetworkEntries, errdefs.ErrInvalidArgument)
	}
	cfg.ClusterCIDRs = slices.Clone(cfg.ClusterCIDRs)
	for i, c := range cfg.ClusterCIDRs {
		if !c.IsValid() || !c.Addr().Is4() {
			return nil, fmt.Errorf("kubernetes runtime: cluster CIDR %q: want IPv4: %w", c, errdefs.ErrInvalidArgument)
		}
		cfg.ClusterCIDRs[i] = c.Masked()
	}
	d := &Driver{cfg: cfg, client: cfg.Client, log: cfg.Logger}
	if len(cfg.Pool) > 0 {
		specs, err := poolSpecs(cfg.Pool)
		if err != nil {
			return nil, err
		}
		d.pool = &pool{specs: specs, owner: randHex(8), wake: make(chan struct{}, 1), creating: map[string]int{}}
	}
	id, err := loadIdentity(ctx, cfg.Client, cfg.Namespace, cfg.Instance)
	if err != nil {
		d.health = err.Error()
	}
	d.id = id
	if d.health == "" {
		// The pod firewall enforces every mode whatever happens here.
		if err := d.ensureNetworkPolicy(ctx); err != nil {
			d.netpol = err.Error()
			d.log.Warn("kubernetes runtime: no NetworkPolicy (the in-pod firewall still enforces every network mode)", "err", err)
		}
	}
	return d, nil
}

// Name returns the runtime's name.
func (d *Driver) Name() string { return d.cfg.Name }

// Info reports capabilities and health (as found by New).
func (d *Driver) Info(context.Context) runtime.Info {
	info := runtime.Info{Name: d.cfg.Name, Healthy: d.health == "", Capabilities: []runtime.Capability{runtime.CapRecover}}
	if d.cfg.Firewall == podfw.BackendNFTables {
		// The iptables backend (gVisor) enforces mode none only: without
		// a conntrack match it cannot let the replies of a box's own
		// connections in, so the manager refuses the connected modes.
		info.Capabilities = append(info.Capabilities, runtime.CapPodNetwork)
	}
	if d.health != "" {
		info.Detail = "cannot use the cluster: " + d.health
		return info
	}
	class := d.cfg.RuntimeClass
	if class == "" {
		class = "the cluster's default"
	}
	info.Detail = fmt.Sprintf("pods in namespace %s, runtime class %s, agent image %s, pod firewall %s",
		d.cfg.Namespace, class, d.cfg.AgentImage, d.cfg.Firewall)
	d.fwMu.Lock()
	fw := d.fwFailed
	d.fwMu.Unlock()
	if fw != "" {
		info.Detail += fmt.Sprintf("; PODS CANNOT BE FIREWALLED: the pod firewall (%s) failed in the last pod that ran it (%s), so creates fail closed; "+
			"gVisor needs --k8s-firewall %s=%s and runsc --net-raw (docs/DRIVERS.md)", d.cfg.Firewall, fw, d.cfg.Name, podfw.BackendIPTables)
	}
	if d.netpol != "" {
		info.Detail += "; no NetworkPolicy (" + d.netpol + "): network mode none is enforced by the in-pod firewall only"
	}
	return info
}

func podName(id string) string    { return "sbx-" + id }
func secretName(id string) string { return "sbx-" + id + "-tls" }

// Create claims a ready pod of the warm pool that matches spec, if there
// is one (warmpool.go); else it makes the box's TLS Secret and Pod, waits
// for the agent to answer and removes the Secret (the agent has read and
// deleted its copy).
func (d *Driver) Create(ctx context.Context, spec runtime.Spec) (runtime.Handle, error) {
	if err := d.check(spec); err != nil {
		return runtime.Handle{}, err
	}
	if d.health != "" {
		return runtime.Handle{}, fmt.Errorf("kubernetes runtime is unhealthy: %s: %w", d.health, errdefs.ErrUnavailable)
	}
	if h, ok, err := d.claim(ctx, spec); ok || err != nil {
		return h, err
	}
	return d.create(ctx, spec, nil)
}

// create makes a pod for spec (labels, if set, are added to its pod's and
// its Secret's) and waits for its agent.
func (d *Driver) create(ctx context.Context, spec runtime.Spec, labels map[string]string) (runtime.Handle, error) {
	t0 := time.Now()
	box, err := newBoxCert(spec.ID)
	if err != nil {
		return runtime.Handle{}, err
	}
	// The API calls that make objects, and the rollback, run to their end
	// whatever ctx does, so the rollback knows what exists: a create cut
	// off by its context leaves nothing (an object created by a request
	// whose client gave up would outlive the rollback's delete).
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), apiTimeout)
	defer cancel()
	var stack cleanup.Stack
	defer func() { _ = stack.Run() }() // before cancel
	// Each rollback step (and the Secret's deletion once the agent has
	// read it) gets apiTimeout from when it runs: a create that waited
	// longer than that for its pod (one the cluster could not schedule at
	// once) must still delete what it made, not fail on bg's deadline.
	rollback := func(step func(context.Context) error) func() error {
		return func() error {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), apiTimeout)
			defer cancel()
			return step(rctx)
		}
	}
	secrets := d.client.CoreV1().Secrets(d.cfg.Namespace)
	sec := d.secret(spec, box)
	maps.Copy(sec.Labels, labels)
	if _, err := secrets.Create(bg, sec, metav1.CreateOptions{}); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return runtime.Handle{}, fmt.Errorf("creating box %s: a secret %s exists: %w", spec.ID, sec.Name, errdefs.ErrAlreadyExists)
		}
		return runtime.Handle{}, fmt.Errorf("creating box %s's tls secret: %w", spec.ID, err)
	}
	stack.Add(rollback(func(ctx context.Context) error { d.deleteSecret(ctx, spec.ID); return nil }))
	if err := ctx.Err(); err != nil {
		return runtime.Handle{}, fmt.Errorf("creating box %s: %w", spec.ID, err)
	}
	pod := d.pod(spec)
	maps.Copy(pod.Labels, labels)
	created, err := d.client.CoreV1().Pods(d.cfg.Namespace).Create(bg, pod, metav1.CreateOptions{})
	if err != nil {
		if apierrors.IsAlreadyExists(err) {
			return runtime.Handle{}, fmt.Errorf("creating box %s: pod %s exists: %w", spec.ID, pod.Name, errdefs.ErrAlreadyExists)
		}
		if apierrors.IsInvalid(err) {
			return runtime.Handle{}, fmt.Errorf("creating pod for box %s: %w: %w", spec.ID, err, errdefs.ErrInvalidArgument)
		}
		return runtime.Handle{}, fmt.Errorf("creating pod for box %s: %w", spec.ID, err)
	}
	stack.Add(rollback(func(ctx context.Context) error { return d.deletePod(ctx, created.Name, string(created.UID)) }))
	d.createBoxPolicy(bg, spec, created)
	stack.Add(rollback(func(ctx context.Context) error { d.deleteBoxPolicy(ctx, spec.ID); return nil }))
	crashpoint.Hit("k8s-create-pod")
	tPod := time.Now()
	running, err := d.waitRunning(ctx, created)
	if err != nil {
		return runtime.Handle{}, err
	}
	tRunning := time.Now()
	hd := handleData{V: handleVersion, Namespace: d.cfg.Namespace, Pod: created.Name, UID: string(created.UID),
		IP: running.Status.PodIP, AgentCert: box.pin}
	h, err := encodeHandle(spec.ID, d.cfg.Name, hd)
	if err != nil {
		return runtime.Handle{}, err
	}
	if err := d.awaitAgent(ctx, h, hd); err != nil {
		return runtime.Handle{}, err
	}
	tAgent := time.Now()
	_ = rollback(func(ctx context.Context) error { d.deleteSecret(ctx, spec.ID); return nil })()
	stack.Release()
	d.log.Debug("box created", "box", spec.ID, "objects", tPod.Sub(t0), "pod running", tRunning.Sub(tPod),
		"agent answers", tAgent.Sub(tRunning), "secret deleted", time.Since(tAgent))
	return h, nil
}

// check refuses what a pod cannot be made of. The manager refuses by
// capability first; this is the driver's own guard.
func (d *Driver) check(spec runtime.Spec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	if !idRe.MatchString(spec.ID) {
		return fmt.Errorf("box id %q: want [a-z0-9-], at most 32 bytes, starting and ending alphanumeric: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	if spec.Image.Host != nil {
		return fmt.Errorf("runtime %q cannot run the host image (it lacks the %q capability): %w", d.cfg.Name, runtime.CapHostImage, errdefs.ErrFailedPrecondition)
	}
	if spec.Image.Ref == "" {
		return fmt.Errorf("box %s: image has no reference to pull: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	for _, m := range spec.Mounts {
		return fmt.Errorf("runtime %q takes no mounts (box %s asked for one at %s): %w", d.cfg.Name, spec.ID, m.Destination, errdefs.ErrFailedPrecondition)
	}
	if spec.Network != nil && spec.Network.Pod == nil {
		return fmt.Errorf("runtime %q does not join sbx network namespaces (it lacks the %q capability; it takes pod policies): %w", d.cfg.Name, runtime.CapNetwork, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// waitRunning waits until the pod runs with an IP, or fails with why it
// cannot (an image that cannot be pulled, a container that ended).
func (d *Driver) waitRunning(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	pods := d.client.CoreV1().Pods(d.cfg.Namespace)
	w, err := pods.Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", pod.Name).String(),
		ResourceVersion: pod.ResourceVersion,
	})
	if err != nil {
		return nil, fmt.Errorf("watching pod %s: %w", pod.Name, err)
	}
	defer w.Stop()
	cur := pod
	for {
		if done, err := podReady(cur); done || err != nil {
			d.noteFirewall(cur, done)
			return cur, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for pod %s (%s): %w", pod.Name, podState(cur), ctx.Err())
		case ev, ok := <-w.ResultChan():
			if !ok {
				// The watch ended (API server timeout): read and watch again.
				p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
				if err != nil {
					return nil, fmt.Errorf("reading pod %s: %w", pod.Name, err)
				}
				return d.waitRunning(ctx, p)
			}
			switch ev.Type {
			case watch.Deleted:
				return nil, fmt.Errorf("pod %s was deleted while starting: %w", pod.Name, errdefs.ErrNotFound)
			case watch.Error:
				return nil, fmt.Errorf("watching pod %s: %v", pod.Name, apierrors.FromObject(ev.Object))
			}
			if p, ok := ev.Object.(*corev1.Pod); ok {
				cur = p
			}
		}
	}
}

// noteFirewall records whether p's firewall init container failed (for
// Info), once p runs (ran: it succeeded) or cannot run.
func (d *Driver) noteFirewall(p *corev1.Pod, ran bool) {
	msg := ""
	for _, cs := range p.Status.InitContainerStatuses {
		if t := cs.State.Terminated; cs.Name == firewallName && t != nil && t.ExitCode != 0 {
			msg = fmt.Sprintf("exit %d", t.ExitCode)
			if m := strings.TrimSpace(t.Message); m != "" {
				msg = m
			}
		}
	}
	if !ran && msg == "" {
		return // failed for another reason: says nothing of the firewall
	}
	d.fwMu.Lock()
	d.fwFailed = msg
	d.fwMu.Unlock()
}

// podReady says whether p runs with an IP (true, nil), cannot run (an
// error saying why) or is still starting (false, nil).
func podReady(p *corev1.Pod) (bool, error) {
	switch p.Status.Phase {
	case corev1.PodFailed, corev1.PodSucceeded:
		return false, fmt.Errorf("pod %s ended (%s): %w", p.Name, podState(p), errdefs.ErrFailedPrecondition)
	}
	for _, cs := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil {
			switch w.Reason {
			case "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName":
				return false, fmt.Errorf("pod %s: container %s cannot get image %s: %s: %s: %w", p.Name, cs.Name, cs.Image, w.Reason, w.Message, errdefs.ErrNotFound)
			case "CreateContainerConfigError", "CreateContainerError", "RunContainerError":
				return false, fmt.Errorf("pod %s: container %s: %s: %s: %w", p.Name, cs.Name, w.Reason, w.Message, errdefs.ErrFailedPrecondition)
			}
		}
		if t := cs.State.Terminated; t != nil && cs.Name == "box" {
			return false, fmt.Errorf("pod %s: the agent ended: %s (exit %d): %s: %w", p.Name, t.Reason, t.ExitCode, t.Message, errdefs.ErrFailedPrecondition)
		}
	}
	return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", nil
}

// podState is a short account of a pod's state, for errors.
func podState(p *corev1.Pod) string {
	s := string(p.Status.Phase)
	for _, cs := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil && w.Reason != "" {
			s += fmt.Sprintf(", %s: %s %s", cs.Name, w.Reason, w.Message)
		}
		if t := cs.State.Terminated; t != nil && (cs.Name == "box" || t.ExitCode != 0) {
			s += fmt.Sprintf(", %s: %s (exit %d)", cs.Name, t.Reason, t.ExitCode)
			if t.ExitCode != 0 && t.Message != "" {
				s += ": " + strings.TrimSpace(t.Message)
			}
		}
	}
	return s
}

// awaitAgent says Hello until the agent answers or ctx (at most
// runtime.ProbeTimeout) ends.
func (d *Driver) awaitAgent(ctx context.Context, h runtime.Handle, hd handleData) error {
	ctx, cancel := context.WithTimeout(ctx, runtime.ProbeTimeout)
	defer cancel()
	var last error
	for delay := 5 * time.Millisecond; ; delay = min(2*delay, 200*time.Millisecond) {
		if last = d.hello(ctx, h); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the agent of box %s (pod %s): %w (last: %w)", h.ID, hd.Pod, ctx.Err(), last)
		case <-time.After(delay):
		}
	}
}

// Recover re-attaches a box whose pod still runs (the same pod: its uid is
// in the handle) and answers.
func (d *Driver) Recover(ctx context.Context, h runtime.Handle) (runtime.Handle, error) {
	hd, err := d.decode(h)
	if err != nil {
		return runtime.Handle{}, err
	}
	pod, err := d.client.CoreV1().Pods(hd.Namespace).Get(ctx, hd.Pod, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && string(pod.UID) != hd.UID) {
		d.deleteSecret(ctx, h.ID)
		return runtime.Handle{}, fmt.Errorf("recovering box %s: pod %s is gone: %w", h.ID, hd.Pod, errdefs.ErrNotFound)
	}
	if err != nil {
		return runtime.Handle{}, fmt.Errorf("recovering box %s: reading pod %s: %w", h.ID, hd.Pod, err)
	}
	if ok, perr := podReady(pod); !ok {
		_ = d.Destroy(ctx, h)
		return runtime.Handle{}, fmt.Errorf("recovering box %s: pod %s does not run (%s, %v): %w", h.ID, hd.Pod, podState(pod), perr, errdefs.ErrNotFound)
	}
	if err := d.hello(ctx, h); err != nil {
		_ = d.Destroy(ctx, h)
		return runtime.Handle{}, fmt.Errorf("recovering box %s: agent does not answer: %v: %w", h.ID, err, errdefs.ErrNotFound)
	}
	return h, nil
}

// Pause is not supported: Kubernetes cannot freeze a pod.
func (d *Driver) Pause(context.Context, runtime.Handle) error {
	return runtime.Info{Name: d.cfg.Name}.Require(runtime.CapPause, "pausing a sandbox")
}

// Resume is not supported (see Pause).
func (d *Driver) Resume(context.Context, runtime.Handle) error {
	return runtime.Info{Name: d.cfg.Name}.Require(runtime.CapPause, "resuming a sandbox")
}

// Stats is not supported: the driver reads no node's cgroups.
func (d *Driver) Stats(context.Context, runtime.Handle) (runtime.Stats, error) {
	return runtime.Stats{}, runtime.Info{Name: d.cfg.Name}.Require(runtime.CapStats, "sandbox stats")
}

// Destroy deletes the box's pod and Secret and waits until the pod is
// gone. Idempotent; works from the id alone (a handle it cannot read): the
// pod named for the box, and any pod labelled with its id (a pod claimed
// from the warm pool keeps its pool name).
func (d *Driver) Destroy(ctx context.Context, h runtime.Handle) error {
	d.deleteSecret(ctx, h.ID)
	if idRe.MatchString(h.ID) {
		d.deleteBoxPolicy(ctx, h.ID)
	}
	if hd, err := d.decode(h); err == nil {
		return d.deletePod(ctx, hd.Pod, hd.UID)
	}
	var errs []error
	names := []string{podName(h.ID)}
	if idRe.MatchString(h.ID) {
		pods, err := d.client.CoreV1().Pods(d.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: d.selector() + "," + labelID + "=" + h.ID})
		if err != nil {
			errs = append(errs, fmt.Errorf("listing pods of box %s: %w", h.ID, err))
		} else {
			for _, p := range pods.Items {
				if p.Name != names[0] {
					names = append(names, p.Name)
				}
			}
		}
	}
	for _, name := range names {
		errs = append(errs, d.deletePod(ctx, name, ""))
	}
	return errors.Join(errs...)
}

// deletePod deletes the pod called name (only the one with uid, if given)
// and waits until it is gone.
func (d *Driver) deletePod(ctx context.Context, name, uid string) error {
	gone, err := d.requestDelete(ctx, name, uid)
	if err != nil || gone {
		return err
	}
	return d.waitGone(ctx, name)
}

// requestDelete asks for the deletion of the pod called name (only the one
// with uid, if given); gone says there is none to wait for. The grace period is
// 1 s, not 0: 0 is a forced delete, which removes the API object at once
// while the kubelet is still to kill the containers (a destroyed box
// answered its Dial); with 1 the object goes only once the kubelet has
// killed them (the agent ignores SIGTERM, so it is SIGKILLed after the
// second).
func (d *Driver) requestDelete(ctx context.Context, name, uid string) (gone bool, err error) {
	grace := int64(1)
	opts := metav1.DeleteOptions{GracePeriodSeconds: &grace}
	if uid != "" {
		u := types(uid)
		opts.Preconditions = &metav1.Preconditions{UID: &u}
	}
	err = d.client.CoreV1().Pods(d.cfg.Namespace).Delete(ctx, name, opts)
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return true, nil // gone, or another pod of that name (not ours)
	}
	if err != nil {
		return false, fmt.Errorf("deleting pod %s: %w", name, err)
	}
	return false, nil
}

// waitGone waits until the pod named name no longer exists.
func (d *Driver) waitGone(ctx context.Context, name string) error {
	pods := d.client.CoreV1().Pods(d.cfg.Namespace)
	for delay := 20 * time.Millisecond; ; delay = min(2*delay, 500*time.Millisecond) {
		_, err := pods.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for pod %s to go: %w", name, ctx.Err())
		case <-time.After(delay):
		}
	}
}

func (d *Driver) deleteSecret(ctx context.Context, id string) {
	err := d.client.CoreV1().Secrets(d.cfg.Namespace).Delete(ctx, secretName(id), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		d.log.Warn("deleting box tls secret", "box", id, "err", err)
	}
}

// Cleanup deletes this driver's pods and Secrets whose boxes are not in keep.
func (d *Driver) Cleanup(ctx context.Context, keep map[string]bool) error {
	if d.health != "" {
		return nil // nothing reachable to clean
	}
	left, err := d.list(ctx, keep)
	if err != nil {
		return err
	}
	// Every deletion first, then the waits: the kubelet kills them in
	// parallel.
	var errs []error
	var waits []string
	for _, l := range left {
		if !l.pod {
			d.deleteSecret(ctx, l.id)
			continue
		}
		gone, err := d.requestDelete(ctx, l.name, "")
		errs = append(errs, err)
		if err == nil && !gone {
			waits = append(waits, l.name)
		}
	}
	for _, name := range waits {
		errs = append(errs, d.waitGone(ctx, name))
	}
	return errors.Join(errs...)
}

// Dial connects to the box's agent API.
func (d *Driver) Dial(ctx context.Context, h runtime.Handle) (net.Conn, error) {
	return d.dial(ctx, h, apiPort)
}

// DialExec connects to the box's framed exec listener.
func (d *Driver) DialExec(ctx context.Context, h runtime.Handle) (net.Conn, error) {
	return d.dial(ctx, h, execPort)
}

var _ runtime.ExecDialer = (*Driver)(nil)

func (d *Driver) decode(h runtime.Handle) (handleData, error) {
	hd, _, err := runtime.DecodeHandle[handleData](h, handleVersion)
	if err != nil {
		return hd, err
	}
	if hd.Pod == "" || hd.Namespace == "" || hd.AgentCert == "" || net.ParseIP(hd.IP) == nil {
		return hd, fmt.Errorf("kubernetes handle of box %s lacks its pod or agent certificate: %w", h.ID, errdefs.ErrInvalidArgument)
	}
	return hd, nil
}
