package sbx

import (
	"context"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// Tenant describes the client's tenant: its quotas (0: unlimited) and what
// it holds against them (sandboxes, their resources, and its images',
// volumes' and codebases' storage). In single-user mode it is the daemon
// owner, named "", without quotas.
func (c *Client) Tenant(ctx context.Context) (*sbxv1.Tenant, error) {
	resp, err := c.tenants.GetTenant(ctx, connect.NewRequest(&sbxv1.GetTenantRequest{}))
	if err != nil {
		return nil, wrap("get tenant", err)
	}
	return resp.Msg.GetTenant(), nil
}

// GetTenant describes tenant name (the daemon's admin token only; a
// tenant's token gets NotFound for any name but its own).
func (c *Client) GetTenant(ctx context.Context, name string) (*sbxv1.Tenant, error) {
	resp, err := c.tenants.GetTenant(ctx, connect.NewRequest(&sbxv1.GetTenantRequest{Name: name}))
	if err != nil {
		return nil, wrap("get tenant "+name, err)
	}
	return resp.Msg.GetTenant(), nil
}

// ListTenants describes every tenant of the daemon's tenants file with
// its quotas and usage (the daemon's admin token only).
func (c *Client) ListTenants(ctx context.Context) ([]*sbxv1.Tenant, error) {
	resp, err := c.tenants.ListTenants(ctx, connect.NewRequest(&sbxv1.ListTenantsRequest{}))
	if err != nil {
		return nil, wrap("list tenants", err)
	}
	return resp.Msg.GetTenants(), nil
}
