package sandbox

import (
	"context"
	"fmt"
	"net/netip"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/tenant"
)

// Tenancy: every box belongs to a tenant ("" in single-user mode) and may
// have a parent, the box whose scoped token created it. A Principal
// (tenant.FromContext) sees a box when the tenants match and, for a scoped
// Principal, when the box is one of its sandbox's children. lookup and
// List apply that to every call that names a sandbox, so a box out of
// sight is indistinguishable from one that does not exist.

// nameKey is the key of names: names are unique per tenant.
func nameKey(tenantName, name string) string { return tenantName + "\x00" + name }

// visible reports whether p may see box id of tenant t with parent parent.
// The admin token is no tenant: it sees no box (not even the owner's); an
// envd token sees its own sandbox alone.
func visible(p tenant.Principal, id, t, parent string) bool {
	return !p.Admin && t == p.Tenant && (p.Scope == "" || parent == p.Scope) && (p.Only == "" || id == p.Only)
}

// Owner returns the tenant sandbox id belongs to ("" in single-user mode);
// false when no such sandbox exists (destroyed ones included). The front
// asks it to check a sandbox's envd token, which names the sandbox.
func (m *Manager) Owner(id string) (string, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	b, ok := m.boxes[id]
	if !ok {
		return "", false
	}
	return b.tenant, true
}

// usageOf is what box b counts against its tenant's quotas.
func usageOf(b *box) tenant.Usage { return usageOfSpec(b.spec()) }

// usageOfSpec is what a box of spec counts against its tenant's quotas.
func usageOfSpec(spec *sbxv1.CreateSandboxRequest) tenant.Usage {
	r := spec.GetResources()
	return tenant.Usage{Sandboxes: 1, MemoryBytes: r.GetMemoryBytes(), CPUMillis: r.GetCpuMillis(), DiskBytes: r.GetDiskBytes()}
}

// usageLocked sums what tenant t's boxes hold; m.mu must be held.
func (m *Manager) usageLocked(t string) tenant.Usage {
	var u tenant.Usage
	for _, b := range m.boxes {
		if b.tenant == t {
			u = u.Add(usageOf(b))
		}
	}
	return u
}

// Usage returns what ctx's tenant's sandboxes hold.
func (m *Manager) Usage(ctx context.Context) tenant.Usage {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.usageLocked(tenant.FromContext(ctx).Tenant)
}

// checkOwner refuses what a create asks that its Principal may not have.
func (m *Manager) checkOwner(ctx context.Context, req *sbxv1.CreateSandboxRequest) error {
	p := tenant.FromContext(ctx)
	if req.GetScopedToken() && m.cfg.BoxAPIAddr == "" {
		return fmt.Errorf("scoped_token: this daemon gives boxes no API endpoint (it runs without networking): %w", errdefs.ErrFailedPrecondition)
	}
	if req.GetScopedToken() && req.GetNetwork().GetMode() == sbxv1.NetworkMode_NETWORK_MODE_NONE {
		return invalid("scoped_token needs networking: the box reaches the API on the network gateway, and network mode is none")
	}
	// Images resolve in the tenant's own store (Images picks it by ctx),
	// volumes in its own volumes, codebases among its own codebases (the
	// codebase manager picks by ctx). A scoped token's children may use the
	// tenant's images but not its volumes or codebases (its data).
	if p.Admin {
		return fmt.Errorf("the admin token manages tenants only and creates no sandboxes: %w", errdefs.ErrPermissionDenied)
	}
	if p.Scope != "" && len(req.GetVolumes()) > 0 {
		return fmt.Errorf("volumes: a scoped sandbox token cannot mount its tenant's volumes: %w", errdefs.ErrPermissionDenied)
	}
	if p.Scope != "" && len(req.GetCodebases()) > 0 {
		return fmt.Errorf("codebases: a scoped sandbox token cannot mount its tenant's codebases: %w", errdefs.ErrPermissionDenied)
	}
	return nil
}

// scopedEnv is the environment a box with a scoped token gets.
func (m *Manager) scopedEnv(b *box) []string {
	if b.token == "" {
		return nil
	}
	return []string{"SBX_TOKEN=" + b.token, "SBX_ADDR=http://" + m.cfg.BoxAPIAddr}
}

// ScopedPrincipal returns who a sandbox's scoped token acts as: the box's
// tenant, scoped to the box's children, and the box's IP address (a scoped
// token is accepted on the box endpoint only from its own box). ok is false
// for a token no live box holds.
func (m *Manager) ScopedPrincipal(tok string) (p tenant.Principal, ip netip.Addr, ok bool) {
	if tok == "" {
		return p, ip, false
	}
	m.mu.RLock()
	id, found := m.scoped[tenant.HashToken(tok)]
	b := m.boxes[id]
	m.mu.RUnlock()
	if !found || b == nil {
		return p, ip, false
	}
	b.mu.Lock()
	ip = b.net.IP
	b.mu.Unlock()
	return tenant.Principal{Tenant: b.tenant, Scope: b.id}, ip, true
}

// destroyChildren destroys the children of box id (and theirs).
func (m *Manager) destroyChildren(ctx context.Context, id string) {
	m.mu.RLock()
	var kids []*box
	for _, b := range m.boxes {
		if b.parent == id {
			kids = append(kids, b)
		}
	}
	m.mu.RUnlock()
	for _, k := range kids {
		if err := m.destroyBox(ctx, k, "its parent sandbox "+id+" was destroyed"); err != nil {
			m.log.Error("destroying a child sandbox", "sandbox", k.id, "parent", id, "err", err)
		}
	}
}

// reapOrphans destroys recovered boxes whose parent did not survive the
// restart (children die with their parent, also across a crash).
func (m *Manager) reapOrphans(ctx context.Context) {
	m.mu.RLock()
	var orphans []*box
	for _, b := range m.boxes {
		if _, ok := m.boxes[b.parent]; b.parent != "" && !ok {
			orphans = append(orphans, b)
		}
	}
	m.mu.RUnlock()
	for _, b := range orphans {
		if err := m.destroyBox(ctx, b, "its parent sandbox "+b.parent+" is gone"); err != nil {
			m.log.Error("destroying an orphaned child sandbox", "sandbox", b.id, "err", err)
		}
	}
}

// Sees reports whether ctx's Principal may see sandbox id (codeexec asks it
// of sessions' and contexts' sandboxes).
//
// With a shared store, a box this replica has not adopted yet (another
// replica made it since the last sweep) is looked up there first.
func (m *Manager) Sees(ctx context.Context, id string) bool {
	p := tenant.FromContext(ctx)
	m.mu.RLock()
	b, ok := m.boxes[id]
	m.mu.RUnlock()
	if ok {
		return visible(p, id, b.tenant, b.parent)
	}
	if m.shared != nil && IsID(id) {
		_, err := m.lookupShared(ctx, id)
		if err == nil {
			return true // lookupShared answers only what p may see
		}
		if !errdefs.IsNotFound(err) {
			return false
		}
	}
	// A box that is gone: only the single-user owner's own records.
	return p.Tenant == "" && p.Scope == "" && p.Only == "" && !p.Admin
}
