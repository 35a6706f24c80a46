package sbx

import (
	"context"
	"strings"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// NetworkPolicy says what a sandbox may reach.
type NetworkPolicy struct {
	// Mode is "none" (loopback only), "public" (the default: the internet
	// but not the host, private ranges or other sandboxes) or "allow" (only
	// AllowCIDRs and AllowDomains).
	Mode string
	// AllowCIDRs: with "allow" the reachable destinations; with "public"
	// holes in the blocked ranges.
	AllowCIDRs []string
	// AllowDomains ("allow" only): names or "*.example.com" wildcards.
	AllowDomains []string
	// DenyCIDRs are blocked in every mode.
	DenyCIDRs []string
}

// Proto converts the policy to its API form.
func (p NetworkPolicy) Proto() *sbxv1.NetworkPolicy {
	mode := sbxv1.NetworkMode_NETWORK_MODE_UNSPECIFIED
	switch strings.ToLower(p.Mode) {
	case "none":
		mode = sbxv1.NetworkMode_NETWORK_MODE_NONE
	case "public":
		mode = sbxv1.NetworkMode_NETWORK_MODE_PUBLIC
	case "allow":
		mode = sbxv1.NetworkMode_NETWORK_MODE_ALLOW
	case "":
	default:
		mode = sbxv1.NetworkMode(-1) // the daemon rejects it, naming it
	}
	return &sbxv1.NetworkPolicy{Mode: mode, AllowCidrs: p.AllowCIDRs, AllowDomains: p.AllowDomains, DenyCidrs: p.DenyCIDRs}
}

// UpdateNetwork replaces the sandbox's network policy while it runs.
func (s *Sandbox) UpdateNetwork(ctx context.Context, p NetworkPolicy) error {
	resp, err := s.c.api.UpdateNetwork(ctx, connect.NewRequest(&sbxv1.UpdateNetworkRequest{Sandbox: s.ID, Network: p.Proto()}))
	if err != nil {
		return wrap("update network of sandbox "+s.ID, err)
	}
	s.Info = resp.Msg.GetSandbox()
	return nil
}
