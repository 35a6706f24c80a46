package kubernetes

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"sync"
	"time"

	"connectrpc.com/connect"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"

	agentv1 "github.com/sbxdev/sbx/api/gen/agent/v1"
	"github.com/sbxdev/sbx/internal/agentconn"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
)

// The warm pool keeps pods started ahead, per image and limits (the
// runtime class is the driver's), whose agents already answer: a Create
// with that image and those limits claims one instead of waiting for a pod
// to be scheduled, pulled and started.
//
// Pool pods live in the cluster, not in a daemon's memory, so every
// replica of a daemon (one instance, --state kubernetes) claims from every
// replica's pods. A claim is one Update of the pod with the resourceVersion
// it was listed at: the API server's optimistic concurrency lets exactly
// one of two replicas racing for a pod win, the other gets a conflict and
// tries the next pod. The claim rewrites the pod's labels and annotations
// to the sandbox's (id, name, tenant, labels, lifetime), dropping the pool
// labels, so from then on the pod is an ordinary box of that id.
//
// Nothing of one claimant reaches the pool pod before the claim, and a pod
// is claimed once: the pod spec holds no environment (env and secrets are
// given to the agent at claim, over the pinned TLS connection, with
// Configure), its TLS key pair is its own (made for the pool pod; its
// Secret is deleted once the agent answered, as for any box), and the
// labels are replaced, not merged. What does carry over is what a pod
// cannot change: its name (sbx-w…, kept in the handle) and its hostname.
//
// Each daemon process fills its own share (pods labelled with its owner
// id) to PoolSpec.Size in the background, under a Lease it renews, and
// deletes its unclaimed pods at Close; the other processes delete them
// once that Lease expires (a process killed with SIGKILL: lease.go). The manager never sees pool pods: they have no record, so no
// tenant is charged for them.

// Labels of pool pods.
const (
	labelPool  = "sbx.dev/pool"       // poolKey of the image and limits
	labelOwner = "sbx.dev/pool-owner" // the daemon process that fills it
	labelWarm  = "sbx.dev/warm"       // "starting", then "ready"
	annoPin    = "sbx.dev/agent-cert" // the agent certificate's SHA-256
)

// PoolSpec is one pool: Size ready pods of Image (a reference the cluster
// pulls) with Resources, the limits a create must ask for to match (the
// daemon's defaults for a create that names none).
type PoolSpec struct {
	Image     string
	Resources runtime.Resources
	Size      int
}

// poolKey names the pool of an image and limits in a label value.
func poolKey(image string, r runtime.Resources) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%d\x00%d\x00%d", image, r.MemoryBytes, r.CPUMillis, r.Pids, r.DiskBytes))
	return hex.EncodeToString(sum[:10])
}

// pool is the driver's warm pool state; nil without Config.Pool.
type pool struct {
	specs map[string]PoolSpec // by poolKey; immutable
	owner string              // labels this process's pool pods
	wake  chan struct{}
	// cancel stops the filler (nil until StartPool).
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu sync.Mutex
	// creating counts, by poolKey, fills whose pod the API may not list yet.
	creating map[string]int
}

// poolSpecs checks Config.Pool and indexes it by poolKey.
func poolSpecs(cfg []PoolSpec) (map[string]PoolSpec, error) {
	specs := map[string]PoolSpec{}
	for _, ps := range cfg {
		if ps.Image == "" || ps.Size < 0 {
			return nil, fmt.Errorf("warm pool of %q (size %d): want an image and a size of at least 0: %w", ps.Image, ps.Size, errdefs.ErrInvalidArgument)
		}
		key := poolKey(ps.Image, ps.Resources)
		if _, dup := specs[key]; dup {
			return nil, fmt.Errorf("warm pool of %q with limits %+v is given twice: %w", ps.Image, ps.Resources, errdefs.ErrInvalidArgument)
		}
		specs[key] = ps
	}
	return specs, nil
}

// StartPool starts filling this process's share of the pools of
// Config.Pool in the background, under a Lease, and sweeping the pool pods
// of dead processes (lease.go), until Close. A driver that was not started
// still claims from the pods other replicas fill.
func (d *Driver) StartPool() {
	if d.sweep != nil || d.health != "" {
		return
	}
	d.startSweeper()
	p := d.pool
	if p == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	p.wg.Add(1)
	go d.fill(ctx)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (p *pool) wakeUp() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// fill keeps this process's share of each pool at its size: every second,
// and when a claim or a fill wakes it.
func (d *Driver) fill(ctx context.Context) {
	p := d.pool
	defer p.wg.Done()
	select { // no pool pod without this process's Lease
	case <-ctx.Done():
		return
	case <-d.sweep.leased:
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		for key, ps := range p.specs {
			// Read the fills in flight before listing: a pod counted twice
			// only delays a fill to the next round, one missed would be
			// made twice.
			p.mu.Lock()
			n := p.creating[key]
			p.mu.Unlock()
			pods, err := d.client.CoreV1().Pods(d.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: d.poolSelector(key) + "," + labelOwner + "=" + p.owner})
			if err != nil {
				if ctx.Err() == nil {
					d.log.Warn("warm pool: listing pods", "image", ps.Image, "err", err)
				}
				continue
			}
			for range ps.Size - n - len(pods.Items) {
				p.mu.Lock()
				p.creating[key]++
				p.mu.Unlock()
				p.wg.Add(1)
				go d.fillOne(ctx, key, ps)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-tick.C:
		}
	}
}

func (d *Driver) poolSelector(key string) string {
	return d.selector() + "," + labelPool + "=" + key
}

// fillOne starts one pool pod and marks it ready once its agent answers.
func (d *Driver) fillOne(ctx context.Context, key string, ps PoolSpec) {
	p := d.pool
	defer p.wg.Done()
	listed := false
	listable := func() {
		if !listed {
			listed = true
			p.mu.Lock()
			p.creating[key]--
			p.mu.Unlock()
		}
	}
	defer listable()
	id := "w" + randHex(10)
	spec := runtime.Spec{ID: id, Image: runtime.Image{Ref: ps.Image}, Resources: ps.Resources, Hostname: id, Workdir: "/"}
	h, err := d.create(ctx, spec, map[string]string{labelPool: key, labelOwner: p.owner, labelWarm: "starting"})
	listable() // the pod exists (and is listed), or create rolled it back
	if err != nil {
		if ctx.Err() == nil {
			d.log.Warn("warm pool: starting a pod", "image", ps.Image, "err", err)
			select { // the next round retries
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
		return
	}
	hd, err := d.decode(h)
	if err == nil {
		patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:"ready"},"annotations":{%q:%q}}}`, labelWarm, annoPin, hd.AgentCert)
		_, err = d.client.CoreV1().Pods(d.cfg.Namespace).Patch(ctx, hd.Pod, ktypes.MergePatchType, patch, metav1.PatchOptions{})
	}
	if err != nil {
		bg, cancel := context.WithTimeout(context.Background(), apiTimeout)
		defer cancel()
		if derr := d.Destroy(bg, h); derr != nil {
			d.log.Warn("warm pool: deleting a pod", "pod", hd.Pod, "err", derr)
		}
		if ctx.Err() == nil {
			d.log.Warn("warm pool: marking a pod ready", "pod", hd.Pod, "err", err)
		}
		return
	}
	d.log.Debug("warm pool: pod ready", "pod", hd.Pod, "image", ps.Image)
}

// claim turns a ready pool pod matching spec into box spec.ID; ok is false
// when no pool matches or none of its pods is ready (the caller creates
// cold).
func (d *Driver) claim(ctx context.Context, spec runtime.Spec) (h runtime.Handle, ok bool, err error) {
	p := d.pool
	// The pool's agents run no command, and its pods were made for no
	// network of the box's: such creates are made cold.
	if p == nil || len(spec.Command) > 0 || spec.Network != nil {
		return runtime.Handle{}, false, nil
	}
	key := poolKey(spec.Image.Ref, spec.Resources)
	if _, pooled := p.specs[key]; !pooled {
		return runtime.Handle{}, false, nil
	}
	pods := d.client.CoreV1().Pods(d.cfg.Namespace)
	// From the API server's cache: a stale entry only costs a conflict.
	list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: d.poolSelector(key) + "," + labelWarm + "=ready", ResourceVersion: "0"})
	if err != nil {
		return runtime.Handle{}, false, fmt.Errorf("listing warm pods for box %s: %w", spec.ID, err)
	}
	defer p.wakeUp()
	// Start at a random pod: replicas claiming at once mostly miss each other.
	n := len(list.Items)
	off := 0
	if n > 0 {
		off = mrand.IntN(n)
	}
	for i := range n {
		cand := list.Items[(off+i)%n]
		if cand.DeletionTimestamp != nil || cand.Status.PodIP == "" || cand.Annotations[annoPin] == "" {
			continue
		}
		claimed := cand.DeepCopy()
		meta := d.meta(claimed.Name, spec)
		claimed.Labels = meta.Labels // the pool's labels go
		claimed.Annotations = meta.Annotations
		claimed.Annotations[annoPin] = cand.Annotations[annoPin]
		got, err := pods.Update(ctx, claimed, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			continue // another claim (or a delete) won it
		}
		if err != nil {
			// The update may have been applied (a cut-off request): a pod
			// labelled as this box must not outlive the failed create.
			bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), apiTimeout)
			if cur, gerr := pods.Get(bg, cand.Name, metav1.GetOptions{}); gerr == nil && cur.Labels[labelID] == spec.ID {
				_ = d.deletePod(bg, cur.Name, string(cur.UID))
			}
			cancel()
			return runtime.Handle{}, false, fmt.Errorf("claiming warm pod %s for box %s: %w", cand.Name, spec.ID, err)
		}
		hd := handleData{V: handleVersion, Namespace: d.cfg.Namespace, Pod: got.Name, UID: string(got.UID),
			IP: got.Status.PodIP, AgentCert: cand.Annotations[annoPin]}
		if h, err = encodeHandle(spec.ID, d.cfg.Name, hd); err == nil {
			err = d.configure(ctx, h, spec)
		}
		if err != nil {
			// The pod is this box's now: delete it and create cold.
			bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), apiTimeout)
			_ = d.deletePod(bg, got.Name, string(got.UID))
			cancel()
			d.log.Warn("warm pool: configuring a claimed pod failed; creating cold", "box", spec.ID, "pod", got.Name, "err", err)
			return runtime.Handle{}, false, nil
		}
		d.log.Debug("warm pool: pod claimed", "box", spec.ID, "pod", got.Name)
		return h, true, nil
	}
	return runtime.Handle{}, false, nil
}

// configure gives a claimed pod's agent the box's environment and workdir
// (what a cold pod gets in its spec).
func (d *Driver) configure(ctx context.Context, h runtime.Handle, spec runtime.Spec) error {
	c := agentconn.New(func(ctx context.Context) (net.Conn, error) { return d.Dial(ctx, h) })
	defer c.Close()
	if _, err := c.Configure(ctx, connect.NewRequest(&agentv1.ConfigureRequest{Env: spec.Env, Workdir: spec.Workdir})); err != nil {
		return fmt.Errorf("configuring the agent of box %s: %w", h.ID, err)
	}
	return nil
}

// Close stops filling the pools and deletes this process's unclaimed pool
// pods (a pod another replica claims meanwhile is its own: each delete is
// conditional on the resourceVersion it was listed at).
func (d *Driver) Close(ctx context.Context) error {
	if d.sweep == nil {
		return nil
	}
	p := d.pool
	if p == nil {
		return d.stopSweeper(ctx, false)
	}
	p.cancel()
	p.wg.Wait()
	if err := d.closePool(ctx); err != nil {
		// The Lease stays, unrenewed: the other processes' sweeps delete
		// what is left once it expires.
		_ = d.stopSweeper(ctx, false)
		return err
	}
	return d.stopSweeper(ctx, true)
}

// closePool deletes this process's unclaimed pool pods.
func (d *Driver) closePool(ctx context.Context) error {
	p := d.pool
	pods := d.client.CoreV1().Pods(d.cfg.Namespace)
	var errs []error
	for range 5 {
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: d.selector() + "," + labelOwner + "=" + p.owner})
		if err != nil {
			return fmt.Errorf("listing warm pods: %w", err)
		}
		if len(list.Items) == 0 {
			return nil
		}
		errs = errs[:0]
		conflicts := 0
		var names []string
		for _, pod := range list.Items {
			grace := int64(1)
			rv := pod.ResourceVersion
			err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
			switch {
			case apierrors.IsConflict(err):
				conflicts++ // claimed or changed: look again
			case apierrors.IsNotFound(err):
			case err != nil:
				errs = append(errs, fmt.Errorf("deleting warm pod %s: %w", pod.Name, err))
			default:
				names = append(names, pod.Name)
			}
		}
		for _, name := range names {
			errs = append(errs, d.waitGone(ctx, name))
		}
		if conflicts == 0 {
			return errors.Join(errs...)
		}
	}
	return errors.Join(append(errs, errors.New("warm pods kept changing while being deleted"))...)
}
