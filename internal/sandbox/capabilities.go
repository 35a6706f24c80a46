package sandbox

import (
	"context"
	"fmt"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/network"
	"github.com/sbxdev/sbx/internal/runtime"
)

// defaultNetworkFor makes a create that names no network mode ask for none
// when its runtime has no networking (CapNetwork): such a box has loopback
// only, and only an explicit public or allow-listed mode is refused.
func defaultNetworkFor(info runtime.Info, spec *sbxv1.CreateSandboxRequest) {
	if info.Has(runtime.CapNetwork) || spec.GetNetwork().GetMode() != sbxv1.NetworkMode_NETWORK_MODE_UNSPECIFIED {
		return
	}
	if spec.Network == nil {
		spec.Network = &sbxv1.NetworkPolicy{}
	}
	spec.Network.Mode = sbxv1.NetworkMode_NETWORK_MODE_NONE
}

// requireCapabilities refuses a create its runtime cannot serve, naming the
// runtime and the capability it lacks. It runs before anything is made for
// the sandbox (record, network, mounts, box), so a refusal leaves nothing.
// spec has its image resolved and its path policies (codebases' guards
// included) filled in.
func (m *Manager) requireCapabilities(info runtime.Info, spec *sbxv1.CreateSandboxRequest, img *ResolvedImage, pol network.Policy) error {
	type need struct {
		cap  runtime.Capability
		when bool
		what string
	}
	connected := pol.Mode != network.ModeNone
	podNet := info.Has(runtime.CapPodNetwork) && !info.Has(runtime.CapNetwork)
	for _, n := range []need{
		{runtime.CapHostImage, spec.GetImage() == HostImage, "the host image"},
		{runtime.CapHostImage, img != nil && img.OnHost && spec.GetImage() != HostImage, fmt.Sprintf("image %q (a snapshot of a host-image sandbox)", spec.GetImage())},
		{runtime.CapPathPolicies, len(spec.GetPathPolicies()) > 0, "path policies"},
		{runtime.CapVolumes, len(spec.GetVolumes()) > 0, "volumes"},
		{runtime.CapCodebases, len(spec.GetCodebases()) > 0, "codebases"},
		{runtime.CapPause, spec.GetIdleAction() == sbxv1.IdleAction_IDLE_ACTION_STOP, "stopping sandboxes when idle"},
		{runtime.CapNetwork, !podNet && m.cfg.Network != nil && connected, fmt.Sprintf("network mode %q", pol.Mode)},
		// A pod policy has no names: they need the daemon's DNS forwarder.
		{runtime.CapNetwork, podNet && len(pol.AllowDomains) > 0, "allow_domains (allow-listed names need the daemon's DNS forwarder; allow their addresses as allow_cidrs)"},
		{runtime.CapNetwork, len(spec.GetDomainSecrets()) > 0, "domain secrets"},
		{runtime.CapNetwork, spec.GetScopedToken(), "scoped tokens (the box reaches the API over the network)"},
	} {
		if n.when {
			if err := info.Require(n.cap, n.what); err != nil {
				return err
			}
		}
	}
	return nil
}

// require is Info.Require for box b's runtime.
func (b *box) require(ctx context.Context, c runtime.Capability, what string) error {
	return b.driver.Info(ctx).Require(c, what)
}
