package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Each daemon process fills its own share of the warm pool, and a process
// killed with SIGKILL never runs its Close: its unclaimed pool pods (and
// the TLS Secret of a pod it was making) would stay for good. So a process
// with a pool holds a coordination.k8s.io Lease, "sbx-pool-<runtime>-<owner>",
// labelled like its pool pods and renewed every third of its duration, and
// makes its first pool pod only once the Lease exists. Every process that
// started its pools (StartPool, with or without a pool of its own) sweeps:
// unclaimed pool pods and pool Secrets of this runtime and instance whose
// owner has no Lease, or a Lease that has not changed for its duration,
// are deleted, and so is that Lease.
//
// Expiry is judged by the sweeper's own clock, client-go's leader-election
// way: a Lease is dead once its resourceVersion stayed the same for its
// leaseDurationSeconds since this sweeper first saw it, whatever the
// renewTime written by the owner's clock says. A pod without its owner's
// Lease is an orphan at once: its owner made the Lease before it, so the
// Lease was deleted since (the owner's Close, or a sweeper). The pods are
// listed before the Leases for the same reason.
//
// A claim rewrites a pod's labels (the pool and owner labels go): a claimed
// pod is never selected, and a pod claimed between the sweeper's list and
// its delete is not deleted, as the delete is conditional on the
// resourceVersion listed. A live owner judged dead (its renewals failed
// for a whole duration) only loses unclaimed pods, which it makes again,
// and makes its Lease again.

// DefaultLeaseDuration is Config.LeaseDuration's default.
const DefaultLeaseDuration = 30 * time.Second

// leaseName is the Lease of pool owner on runtime name.
func leaseName(runtimeName, owner string) string { return "sbx-pool-" + runtimeName + "-" + owner }

// sweeper is the state of the orphan sweep and of this process's Lease.
type sweeper struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// leased is closed once this process's Lease first exists (at once
	// without a pool).
	leased chan struct{}

	// seen is what the sweep last saw of other owners' Leases, by owner.
	// Only the sweep goroutine uses it.
	seen map[string]seenLease
	// mine is this process's Lease as last written (nil: read it first).
	// Only the renewal goroutine uses it.
	mine *coordv1.Lease
}

type seenLease struct {
	version string
	since   time.Time // when this sweeper first saw that version
}

// startSweeper starts the Lease renewal (with a pool) and the orphan sweep.
func (d *Driver) startSweeper() {
	ctx, cancel := context.WithCancel(context.Background())
	s := &sweeper{cancel: cancel, leased: make(chan struct{}), seen: map[string]seenLease{}}
	d.sweep = s
	if d.pool != nil {
		s.wg.Add(1)
		go d.holdLease(ctx)
	} else {
		close(s.leased)
	}
	s.wg.Add(1)
	go d.sweepLoop(ctx)
}

// holdLease makes this process's Lease and renews it until ctx ends.
func (d *Driver) holdLease(ctx context.Context) {
	s := d.sweep
	defer s.wg.Done()
	every := d.cfg.LeaseDuration / 3
	first := true
	for {
		err := d.renewLease(ctx)
		switch {
		case err == nil && first:
			first = false
			close(s.leased)
		case err != nil && ctx.Err() == nil:
			d.log.Warn("warm pool: renewing this replica's lease", "lease", leaseName(d.cfg.Name, d.pool.owner), "err", err)
		}
		wait := every
		if first {
			wait = time.Second // no pool pod is made until the Lease exists
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// renewLease writes this process's Lease, making it if it is missing: one
// Update of the version it last wrote, else a read (or a create) first.
func (d *Driver) renewLease(ctx context.Context) error {
	s := d.sweep
	leases := d.client.CoordinationV1().Leases(d.cfg.Namespace)
	name, owner := leaseName(d.cfg.Name, d.pool.owner), d.pool.owner
	secs := int32(d.cfg.LeaseDuration / time.Second)
	now := metav1.NewMicroTime(time.Now())
	if s.mine != nil {
		s.mine.Spec.RenewTime = &now
		l, err := leases.Update(ctx, s.mine, metav1.UpdateOptions{})
		if err == nil {
			s.mine = l
			return nil
		}
		s.mine = nil
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return fmt.Errorf("renewing lease %s: %w", name, err)
		}
	}
	cur, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l := &coordv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: d.cfg.Namespace, Labels: d.poolOwnerLabels()},
			Spec:       coordv1.LeaseSpec{HolderIdentity: &owner, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now},
		}
		if s.mine, err = leases.Create(ctx, l, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating lease %s: %w", name, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading lease %s: %w", name, err)
	}
	cur.Spec.RenewTime, cur.Spec.LeaseDurationSeconds, cur.Spec.HolderIdentity = &now, &secs, &owner
	if s.mine, err = leases.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("renewing lease %s: %w", name, err)
	}
	return nil
}

// poolOwnerLabels labels this process's Lease, pool pods and their Secrets.
func (d *Driver) poolOwnerLabels() map[string]string {
	return map[string]string{labelManagedBy: "sbx", labelRuntime: d.cfg.Name, labelInstance: d.cfg.Instance, labelOwner: d.pool.owner}
}

// sweepLoop runs sweepOrphans every half Lease duration until ctx ends.
func (d *Driver) sweepLoop(ctx context.Context) {
	defer d.sweep.wg.Done()
	t := time.NewTicker(d.cfg.LeaseDuration / 2)
	defer t.Stop()
	for {
		if err := d.sweepOrphans(ctx); err != nil && ctx.Err() == nil {
			d.log.Warn("warm pool: deleting dead replicas' pool pods", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sweepOrphans deletes the unclaimed pool pods and pool Secrets of owners
// whose Lease is gone or expired, and those Leases.
func (d *Driver) sweepOrphans(ctx context.Context) error {
	self := ""
	if d.pool != nil {
		self = d.pool.owner
	}
	owned := metav1.ListOptions{LabelSelector: d.selector() + "," + labelOwner}
	// Pods and Secrets first: their owners' Leases are older (see above).
	pods, err := d.client.CoreV1().Pods(d.cfg.Namespace).List(ctx, owned)
	if err != nil {
		return fmt.Errorf("listing pool pods: %w", err)
	}
	leases, err := d.client.CoordinationV1().Leases(d.cfg.Namespace).List(ctx, owned)
	if err != nil {
		return fmt.Errorf("listing pool leases: %w", err)
	}
	now := time.Now()
	live := map[string]bool{}
	var dead []coordv1.Lease
	seen := map[string]seenLease{}
	for _, l := range leases.Items {
		owner := l.Labels[labelOwner]
		if owner == self {
			continue
		}
		s, ok := d.sweep.seen[owner]
		if !ok || s.version != l.ResourceVersion {
			s = seenLease{version: l.ResourceVersion, since: now}
		}
		seen[owner] = s
		dur := d.cfg.LeaseDuration
		if p := l.Spec.LeaseDurationSeconds; p != nil && *p > 0 {
			dur = time.Duration(*p) * time.Second
		}
		if now.Sub(s.since) > dur {
			dead = append(dead, l)
		} else {
			live[owner] = true
		}
	}
	d.sweep.seen = seen
	var errs []error
	deleted := map[string]int{}
	for _, p := range pods.Items {
		owner := p.Labels[labelOwner]
		if owner == self || live[owner] || p.Labels[labelPool] == "" || p.DeletionTimestamp != nil {
			continue
		}
		grace, rv := int64(1), p.ResourceVersion
		err := d.client.CoreV1().Pods(d.cfg.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
		switch {
		case err == nil:
			deleted[owner]++
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err): // gone, or claimed (changed) since the list
		default:
			errs = append(errs, fmt.Errorf("deleting pool pod %s of dead replica %s: %w", p.Name, owner, err))
		}
	}
	for _, l := range dead {
		// The TLS Secret of a pool pod its owner was making goes before the
		// Lease (a Secret outlives its Lease only if this fails: the Lease
		// stays for the next sweep).
		if err := d.deleteOwnerSecrets(ctx, l.Labels[labelOwner]); err != nil {
			errs = append(errs, err)
			continue
		}
		rv := l.ResourceVersion
		err := d.client.CoordinationV1().Leases(d.cfg.Namespace).Delete(ctx, l.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			errs = append(errs, fmt.Errorf("deleting expired lease %s: %w", l.Name, err))
		}
	}
	for owner, n := range deleted {
		d.log.Info("warm pool: deleted the unclaimed pool pods of a dead replica", "owner", owner, "pods", n)
	}
	return errors.Join(errs...)
}

// deleteOwnerSecrets deletes the pool Secrets of owner (a list and a
// delete each: the Role grants no deletecollection).
func (d *Driver) deleteOwnerSecrets(ctx context.Context, owner string) error {
	secrets := d.client.CoreV1().Secrets(d.cfg.Namespace)
	l, err := secrets.List(ctx, metav1.ListOptions{LabelSelector: d.selector() + "," + labelOwner + "=" + owner})
	if err != nil {
		return fmt.Errorf("listing pool secrets of dead replica %s: %w", owner, err)
	}
	var errs []error
	for _, s := range l.Items {
		if err := secrets.Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting pool secret %s of dead replica %s: %w", s.Name, owner, err))
		}
	}
	return errors.Join(errs...)
}

// stopSweeper stops the sweep and the renewal and, if deleteLease, deletes
// this process's Lease (once Close deleted its pool pods).
func (d *Driver) stopSweeper(ctx context.Context, deleteLease bool) error {
	s := d.sweep
	s.cancel()
	s.wg.Wait()
	if d.pool == nil || !deleteLease {
		return nil
	}
	err := d.client.CoordinationV1().Leases(d.cfg.Namespace).Delete(ctx, leaseName(d.cfg.Name, d.pool.owner), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting this replica's pool lease: %w", err)
	}
	return nil
}
