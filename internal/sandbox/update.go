package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"google.golang.org/protobuf/proto"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/tenant"
)

// Update changes a running or stopped sandbox's lifetime, idle timeout,
// labels, limits and auto-resume (UpdateSandbox). Everything is checked
// before anything changes: bad values, the runtime's "update" capability
// for limits, the host's limits and the tenant's memory and CPU quotas. A
// new lifetime counts from now (E2B's setTimeout). The change is persisted
// before Update returns, so the reaper and a restarted daemon honour it.
func (m *Manager) Update(ctx context.Context, req *sbxv1.UpdateSandboxRequest) (*sbxv1.Sandbox, error) {
	b, err := m.lookup(ctx, req.GetSandbox())
	if err != nil {
		return nil, err
	}
	if err := validateUpdate(req, m.cfg.Limits); err != nil {
		return nil, err
	}
	b.opMu.Lock()
	defer b.opMu.Unlock()
	if st := b.state(); st != sbxv1.SandboxState_SANDBOX_STATE_RUNNING && st != sbxv1.SandboxState_SANDBOX_STATE_STOPPED {
		return nil, b.notRunning(st)
	}
	old := b.spec()
	next := proto.Clone(old).(*sbxv1.CreateSandboxRequest)
	applyLabels(next, req)
	if n := len(next.Labels); n > maxLabels {
		return nil, invalid("labels: the update leaves %d, at most %d", n, maxLabels)
	}
	if req.IdleTimeoutMs != nil {
		next.IdleTimeoutMs = req.GetIdleTimeoutMs()
	}
	if a := req.GetIdleAction(); a != sbxv1.IdleAction_IDLE_ACTION_UNSPECIFIED {
		if a == sbxv1.IdleAction_IDLE_ACTION_STOP {
			if err := b.require(ctx, runtime.CapPause, "stopping sandboxes when idle"); err != nil {
				return nil, err
			}
		}
		next.IdleAction = a
	}
	if req.AutoResume != nil {
		next.AutoResume = req.GetAutoResume()
	}

	b.mu.Lock()
	rec := *b.rec
	h := b.handle
	b.mu.Unlock()
	if req.TimeoutMs != nil {
		t := req.GetTimeoutMs()
		next.TimeoutMs = t
		rec.ExpiresAtMs = 0
		if t > 0 {
			rec.ExpiresAtMs = nowMs() + t
		}
		if err := checkLifetime(rec.CreatedAtMs, rec.ExpiresAtMs, m.cfg.Limits.MaxTimeoutMs); err != nil {
			return nil, err
		}
	}

	var up runtime.Updater
	limits := mergeLimits(next, req.GetResources())
	if limits {
		if err := b.require(ctx, runtime.CapUpdate, "changing a sandbox's limits"); err != nil {
			return nil, err
		}
		var ok bool
		if up, ok = b.driver.(runtime.Updater); !ok {
			return nil, fmt.Errorf("runtime %q cannot change limits: %w", b.driver.Name(), errdefs.ErrFailedPrecondition)
		}
		r := next.Resources
		if b.driver.Info(ctx).Has(runtime.CapDiskInMemory) && r.DiskBytes > MaxDiskInMemory(r.MemoryBytes) {
			return nil, invalid("memory %s: runtime %q keeps the sandbox's disk (%s) in its memory, so the memory must be at least %s",
				FormatBytes(r.MemoryBytes), b.driver.Name(), FormatBytes(r.DiskBytes), FormatBytes(minMemoryForDisk(r.DiskBytes)))
		}
		// Reserve the new limits against the tenant's quotas before the
		// driver applies them, so a concurrent create or update counts them.
		if err := m.swapLimits(ctx, b, old, next); err != nil {
			return nil, err
		}
		if err := up.Update(ctx, h, limitsOf(next)); err != nil {
			m.restoreSpec(b, next, old)
			return nil, fmt.Errorf("update limits of sandbox %s: %w", b.id, err)
		}
	}

	specJSON, err := protojsonMarshal(next)
	if err != nil {
		return nil, m.rollBackUpdate(ctx, b, up, h, old, next, err)
	}
	rec.Spec, rec.Labels = specJSON, next.Labels
	if err := m.cfg.Store.UpdateSpec(ctx, &rec); err != nil {
		return nil, m.rollBackUpdate(ctx, b, up, h, old, next, err)
	}
	b.specp.Store(next)
	b.mu.Lock()
	b.rec = &rec
	b.mu.Unlock()
	m.log.Info("sandbox updated", "sandbox", b.id, "expires_at_ms", rec.ExpiresAtMs, "limits", limits)
	return m.toProto(b, nil), nil
}

// rollBackUpdate undoes the limits an update applied (up is nil when it
// changed none) after a later step failed with err, which it returns.
func (m *Manager) rollBackUpdate(ctx context.Context, b *box, up runtime.Updater, h runtime.Handle, old, next *sbxv1.CreateSandboxRequest, err error) error {
	if up == nil {
		return err
	}
	ctx = context.WithoutCancel(ctx)
	if uerr := up.Update(ctx, h, limitsOf(old)); uerr != nil {
		err = errors.Join(err, fmt.Errorf("restoring the old limits: %w", uerr))
	}
	m.restoreSpec(b, next, old)
	return err
}

// swapLimits makes next b's spec if the tenant's memory and CPU quotas
// admit its limits, counting every other box of the tenant as it is now.
// Only quotas the update grows against are checked: lowering a limit is
// always allowed, even for a tenant over a quota lowered since.
func (m *Manager) swapLimits(ctx context.Context, b *box, old, next *sbxv1.CreateSandboxRequest) error {
	q := tenant.FromContext(ctx).Quotas
	o, n := old.GetResources(), next.GetResources()
	var check tenant.Quotas
	if n.GetMemoryBytes() > o.GetMemoryBytes() {
		check.MemoryBytes = q.MemoryBytes
	}
	if n.GetCpuMillis() > o.GetCpuMillis() {
		check.CPUMillis = q.CPUMillis
	}
	if m.ledger != nil {
		// Replicas share the count: the ledger's entry for b is replaced,
		// checked against the tenant's other sandboxes there.
		nu := usageOfSpec(next)
		if err := m.ledger.Reserve(ctx, b.tenant, b.id, nu, func(others tenant.Usage) error { return check.Admit(b.tenant, others, nu) }); err != nil {
			return err
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		b.specp.Store(next)
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	used := m.usageLocked(b.tenant)
	grow := tenant.Usage{MemoryBytes: n.GetMemoryBytes() - o.GetMemoryBytes(), CPUMillis: n.GetCpuMillis() - o.GetCpuMillis()}
	if err := check.Admit(b.tenant, used, grow); err != nil {
		return err
	}
	b.specp.Store(next)
	return nil
}

// restoreSpec puts old back as b's spec if next is still in place (under
// m.mu: usageOf reads it for quotas).
func (m *Manager) restoreSpec(b *box, next, old *sbxv1.CreateSandboxRequest) {
	m.mu.Lock()
	swapped := b.specp.CompareAndSwap(next, old)
	m.mu.Unlock()
	if swapped && m.ledger != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ou := usageOfSpec(old)
		if err := m.ledger.Reserve(ctx, b.tenant, b.id, ou, func(tenant.Usage) error { return nil }); err != nil {
			m.log.Warn("restoring a sandbox's usage in its tenant's ledger (the sweep leaves the larger one)", "sandbox", b.id, "err", err)
		}
	}
}

// applyLabels applies req's label changes to spec.
func applyLabels(spec *sbxv1.CreateSandboxRequest, req *sbxv1.UpdateSandboxRequest) {
	if req.GetReplaceLabels() {
		spec.Labels = maps.Clone(req.GetSetLabels())
		return
	}
	if len(req.GetSetLabels()) == 0 && len(req.GetRemoveLabels()) == 0 {
		return
	}
	labels := maps.Clone(spec.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	for _, k := range req.GetRemoveLabels() {
		delete(labels, k)
	}
	maps.Copy(labels, req.GetSetLabels())
	spec.Labels = labels
}

// mergeLimits puts the limits r sets into spec and reports whether any
// differs from before.
func mergeLimits(spec *sbxv1.CreateSandboxRequest, r *sbxv1.Resources) bool {
	cur := spec.GetResources()
	if cur == nil {
		cur = &sbxv1.Resources{}
	}
	changed := false
	set := func(dst *int64, v int64) {
		if v != 0 && v != *dst {
			*dst, changed = v, true
		}
	}
	set(&cur.MemoryBytes, r.GetMemoryBytes())
	set(&cur.CpuMillis, r.GetCpuMillis())
	set(&cur.Pids, r.GetPids())
	spec.Resources = cur
	return changed
}

// limitsOf is what the driver applies for spec: memory, CPU and pids
// (DiskBytes 0 keeps the disk as it is).
func limitsOf(spec *sbxv1.CreateSandboxRequest) runtime.Resources {
	r := spec.GetResources()
	return runtime.Resources{MemoryBytes: r.GetMemoryBytes(), CPUMillis: r.GetCpuMillis(), Pids: r.GetPids()}
}

// minMemoryForDisk is the least memory whose MaxDiskInMemory holds disk.
func minMemoryForDisk(disk int64) int64 {
	m := disk + 32<<20
	if m > 256<<20 { // past 256 MiB the reserve is an eighth
		m = (disk*8 + 6) / 7
	}
	for MaxDiskInMemory(m) < disk {
		m++
	}
	return m
}

// checkLifetime refuses a deadline (unix ms, 0: none) that makes a life
// from created longer than maxMs (0: unbounded).
func checkLifetime(created, expires, maxMs int64) error {
	if maxMs <= 0 {
		return nil
	}
	latest := created + maxMs
	if expires == 0 {
		return invalid("timeout 0 (no limit): this daemon bounds a sandbox's life to %s (--max-timeout)", time.Duration(maxMs)*time.Millisecond)
	}
	if expires > latest {
		return invalid("timeout: the sandbox would live until %s, but this daemon bounds its life to %s from creation (%s)",
			time.UnixMilli(expires).UTC().Format(time.RFC3339), time.Duration(maxMs)*time.Millisecond, time.UnixMilli(latest).UTC().Format(time.RFC3339))
	}
	return nil
}

// validateUpdate checks an update's values on their own (bounds, label
// syntax); what depends on the box is checked by Update.
func validateUpdate(req *sbxv1.UpdateSandboxRequest, lim Limits) error {
	if t := req.GetTimeoutMs(); t < 0 {
		return invalid("timeout %dms: must not be negative", t)
	}
	if t := req.GetIdleTimeoutMs(); t < 0 {
		return invalid("idle timeout %dms: must not be negative", t)
	}
	if a := req.GetIdleAction(); a < sbxv1.IdleAction_IDLE_ACTION_UNSPECIFIED || a > sbxv1.IdleAction_IDLE_ACTION_STOP {
		return invalid("idle action %d: unknown", a)
	}
	if n := len(req.GetSetLabels()) + len(req.GetRemoveLabels()); n > maxLabels {
		return invalid("labels: %d changes given, at most %d", n, maxLabels)
	}
	if err := checkLabels(req.GetSetLabels()); err != nil {
		return err
	}
	if req.GetReplaceLabels() && len(req.GetRemoveLabels()) > 0 {
		return invalid("remove_labels: not allowed with replace_labels (which sets the labels to exactly set_labels)")
	}
	for _, k := range req.GetRemoveLabels() {
		if !labelKeyRe.MatchString(k) {
			return invalid("label key %q to remove: must match [a-zA-Z0-9][a-zA-Z0-9_./-]{0,62}", k)
		}
		if _, both := req.GetSetLabels()[k]; both {
			return invalid("label %q: both set and removed", k)
		}
	}
	r := req.GetResources()
	if r.GetDiskBytes() != 0 {
		return invalid("disk %s: a sandbox's disk limit cannot be changed by an update", FormatBytes(r.GetDiskBytes()))
	}
	return checkLimits(r, lim)
}
