package server

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/sandbox"
	"github.com/sbxdev/sbx/internal/tenant"
)

// TenantServer implements sbxv1connect.TenantServiceHandler: a token's own
// tenant with its quotas and usage, and every tenant for the admin token.
type TenantServer struct {
	mgr    *sandbox.Manager
	stores *TenantStores
	// tenants is the daemon's tenants file (nil: single-user mode).
	tenants *tenant.Registry
}

var _ sbxv1connect.TenantServiceHandler = (*TenantServer)(nil)

// NewTenantServer returns the tenant service; tenants is nil in
// single-user mode.
func NewTenantServer(mgr *sandbox.Manager, stores *TenantStores, tenants *tenant.Registry) *TenantServer {
	return &TenantServer{mgr: mgr, stores: stores, tenants: tenants}
}

// AddTenants serves the tenant service too.
func (s *Server) AddTenants(t *TenantServer) { s.tenants = t }

// GetTenant describes the caller's tenant, or for the admin token the one
// it names. A tenant naming another tenant gets what a missing name gets.
func (s *TenantServer) GetTenant(ctx context.Context, req *connect.Request[sbxv1.GetTenantRequest]) (*connect.Response[sbxv1.GetTenantResponse], error) {
	p := tenant.FromContext(ctx)
	name := req.Msg.GetName()
	if p.Admin {
		if name == "" {
			return nil, toConnect(fmt.Errorf("the admin token is no tenant: name one: %w", errdefs.ErrInvalidArgument))
		}
		t, ok := s.tenants.Current().Tenant(name)
		if !ok {
			return nil, toConnect(fmt.Errorf("tenant %q: %w", name, errdefs.ErrNotFound))
		}
		out, err := s.describe(tenant.WithPrincipal(ctx, tenant.Principal{Tenant: t.Name, Quotas: t.Quotas}), len(t.Tokens))
		if err != nil {
			return nil, toConnect(err)
		}
		return connect.NewResponse(&sbxv1.GetTenantResponse{Tenant: out}), nil
	}
	if name != "" && name != p.Tenant {
		return nil, toConnect(fmt.Errorf("tenant %q: %w", name, errdefs.ErrNotFound))
	}
	out, err := s.describe(ctx, 0)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.GetTenantResponse{Tenant: out}), nil
}

// ListTenants describes every tenant of the tenants file (admin token only:
// the tenancy rules refuse everyone else).
func (s *TenantServer) ListTenants(ctx context.Context, _ *connect.Request[sbxv1.ListTenantsRequest]) (*connect.Response[sbxv1.ListTenantsResponse], error) {
	if s.tenants == nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("this daemon has no tenants: it runs without --tenants"))
	}
	resp := &sbxv1.ListTenantsResponse{}
	for _, t := range s.tenants.Current().Tenants() {
		out, err := s.describe(tenant.WithPrincipal(ctx, tenant.Principal{Tenant: t.Name, Quotas: t.Quotas}), len(t.Tokens))
		if err != nil {
			return nil, toConnect(fmt.Errorf("tenant %s: %w", t.Name, err))
		}
		resp.Tenants = append(resp.Tenants, out)
	}
	return connect.NewResponse(resp), nil
}

// describe is ctx's Principal's tenant with its quotas and usage.
func (s *TenantServer) describe(ctx context.Context, tokens int) (*sbxv1.Tenant, error) {
	p := tenant.FromContext(ctx)
	u := s.mgr.Usage(ctx)
	st, err := s.stores.StorageUsage(ctx)
	if err != nil {
		return nil, fmt.Errorf("storage usage: %w", err)
	}
	q := p.Quotas
	return &sbxv1.Tenant{
		Name: p.Tenant, ScopeSandbox: p.Scope, Tokens: int32(tokens),
		Quotas: &sbxv1.TenantQuotas{
			MaxSandboxes: int32(q.MaxSandboxes), MemoryBytes: q.MemoryBytes, CpuMillis: q.CPUMillis, DiskBytes: q.DiskBytes, StorageBytes: q.StorageBytes,
		},
		Usage: &sbxv1.TenantUsage{
			Sandboxes: int32(u.Sandboxes), MemoryBytes: u.MemoryBytes, CpuMillis: u.CPUMillis, DiskBytes: u.DiskBytes,
			StorageBytes: st.Total(), ImagesBytes: st.Images, VolumesBytes: st.Volumes, CodebasesBytes: st.Codebases,
		},
	}, nil
}
