package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"google.golang.org/protobuf/proto"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/network"
	"github.com/sbxdev/sbx/internal/runtime"
)

// Network attaches sandboxes to the host's network; *network.Manager
// implements it. With Config.Network nil sandboxes have loopback only.
// Calls for one sandbox are serialised by the manager (opMu).
type Network interface {
	Attach(ctx context.Context, id string, p network.Policy) (network.Attachment, error)
	Update(ctx context.Context, id string, p network.Policy) (network.Attachment, error)
	// Recover re-attaches a sandbox after a daemon restart; secrets are its
	// domain secrets with values (the network's state keeps none).
	Recover(ctx context.Context, id string, secrets []network.Secret) (network.Attachment, error)
	Detach(ctx context.Context, id string) error
	Cleanup(ctx context.Context, keep map[string]bool) error
	Stats(id string) (network.Stats, error)
	// Placeholder is what sandbox id sees in env var name instead of a
	// domain secret's value.
	Placeholder(id, name string) string
	// CABundleDir is a host directory with ca-bundle.crt (host roots plus
	// the egress CA) for boxes with domain secrets.
	CABundleDir() string
}

// policyOf validates an API network policy.
func policyOf(p *sbxv1.NetworkPolicy) (network.Policy, error) {
	mode := ""
	switch p.GetMode() {
	case sbxv1.NetworkMode_NETWORK_MODE_UNSPECIFIED, sbxv1.NetworkMode_NETWORK_MODE_PUBLIC:
		mode = string(network.ModePublic)
	case sbxv1.NetworkMode_NETWORK_MODE_NONE:
		mode = string(network.ModeNone)
	case sbxv1.NetworkMode_NETWORK_MODE_ALLOW:
		mode = string(network.ModeAllow)
	default:
		return network.Policy{}, invalid("network mode %v", p.GetMode())
	}
	return network.ParsePolicy(mode, p.GetAllowCidrs(), p.GetAllowDomains(), p.GetDenyCidrs())
}

// policyProto is the API form of a policy.
func policyProto(p network.Policy) *sbxv1.NetworkPolicy {
	out := &sbxv1.NetworkPolicy{Mode: sbxv1.NetworkMode_NETWORK_MODE_NONE, AllowDomains: p.AllowDomains}
	switch p.Mode {
	case network.ModePublic:
		out.Mode = sbxv1.NetworkMode_NETWORK_MODE_PUBLIC
	case network.ModeAllow:
		out.Mode = sbxv1.NetworkMode_NETWORK_MODE_ALLOW
	}
	for _, c := range p.AllowCIDRs {
		out.AllowCidrs = append(out.AllowCidrs, c.String())
	}
	for _, c := range p.DenyCIDRs {
		out.DenyCidrs = append(out.DenyCidrs, c.String())
	}
	return out
}

// requestedPolicy is the policy a create asks for; without a network
// manager only loopback exists, and asking for more is an error, unless
// the runtime enforces policies itself (CapPodNetwork).
func (m *Manager) requestedPolicy(spec *sbxv1.CreateSandboxRequest, info runtime.Info) (network.Policy, error) {
	pol, err := policyOf(spec.GetNetwork())
	if err != nil {
		return pol, err
	}
	if m.cfg.Network == nil && !info.Has(runtime.CapPodNetwork) {
		if len(spec.GetDomainSecrets()) > 0 {
			return pol, fmt.Errorf("domain secrets need the egress proxy, and networking is off in this daemon: %w", errdefs.ErrFailedPrecondition)
		}
		if mode := spec.GetNetwork().GetMode(); mode != sbxv1.NetworkMode_NETWORK_MODE_UNSPECIFIED && mode != sbxv1.NetworkMode_NETWORK_MODE_NONE {
			return pol, fmt.Errorf("networking is off in this daemon (sandboxes have loopback only): %w", errdefs.ErrFailedPrecondition)
		}
		return network.Policy{Mode: network.ModeNone}, nil
	}
	pol.APIAccess = spec.GetScopedToken()
	return pol, nil
}

// UpdateNetwork replaces a running or stopped sandbox's network policy.
func (m *Manager) UpdateNetwork(ctx context.Context, ref string, p *sbxv1.NetworkPolicy) (*sbxv1.Sandbox, error) {
	b, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	pol, err := policyOf(p)
	if err != nil {
		return nil, err
	}
	pol.APIAccess = b.tokenHash != ""
	if m.cfg.Network == nil {
		return nil, fmt.Errorf("networking is off in this daemon: %w", errdefs.ErrFailedPrecondition)
	}
	if err := b.require(ctx, runtime.CapNetwork, "changing a sandbox's network"); err != nil {
		return nil, err
	}
	b.opMu.Lock()
	defer b.opMu.Unlock()
	if st := b.state(); st != sbxv1.SandboxState_SANDBOX_STATE_RUNNING && st != sbxv1.SandboxState_SANDBOX_STATE_STOPPED {
		return nil, b.notRunning(st)
	}
	b.mu.Lock()
	connected := b.net.IP.IsValid()
	b.mu.Unlock()
	if connected != (pol.Mode != network.ModeNone) {
		// The box's interface comes or goes: only runtimes whose boxes see
		// that in place can (gvisor copies interfaces once, at start).
		if err := b.require(ctx, runtime.CapNetworkReplug, "switching a sandbox between network mode none and a connected mode"); err != nil {
			return nil, err
		}
	}
	old := b.spec()
	b.mu.Lock()
	oldPol, rec := b.net.Policy, *b.rec
	b.mu.Unlock()
	att, err := m.cfg.Network.Update(ctx, b.id, m.withSecrets(b.id, old, pol))
	if err != nil {
		return nil, fmt.Errorf("update network of %s: %w", b.id, err)
	}
	b.mu.Lock()
	b.net = att
	b.mu.Unlock()
	// The sandbox's record keeps the policy too: a restarted daemon reads
	// its spec from there.
	next := proto.Clone(old).(*sbxv1.CreateSandboxRequest)
	next.Network = nil
	if p != nil {
		next.Network = proto.Clone(p).(*sbxv1.NetworkPolicy)
	}
	specJSON, err := protojsonMarshal(next)
	if err == nil {
		rec.Spec = specJSON
		err = m.cfg.Store.UpdateSpec(ctx, &rec)
	}
	if err != nil {
		err = fmt.Errorf("record network policy of %s: %w", b.id, err)
		// Back to the policy the record holds.
		if back, uerr := m.cfg.Network.Update(context.WithoutCancel(ctx), b.id, oldPol); uerr == nil {
			b.mu.Lock()
			b.net = back
			b.mu.Unlock()
		} else {
			err = errors.Join(err, fmt.Errorf("restoring its previous policy: %w", uerr))
		}
		return nil, err
	}
	b.specp.Store(next)
	b.mu.Lock()
	b.rec = &rec
	b.mu.Unlock()
	m.log.Info("sandbox network updated", "sandbox", b.id, "mode", pol.Mode)
	return m.toProto(b, nil), nil
}

// podNetwork is pol for a driver that enforces it itself
// (CapPodNetwork); nil for mode none (loopback only).
func podNetwork(pol network.Policy) *runtime.Network {
	if pol.Mode == network.ModeNone {
		return nil
	}
	mode := runtime.PodPublic
	if pol.Mode == network.ModeAllow {
		mode = runtime.PodAllow
	}
	return &runtime.Network{Pod: &runtime.PodNetwork{Mode: mode, Allow: pol.AllowCIDRs, Deny: pol.DenyCIDRs}}
}

// netAttachment is the driver's view of a network attachment: the
// namespace to join and the nameservers.
func netAttachment(att network.Attachment) *runtime.Network {
	return &runtime.Network{NetNS: &runtime.NetNS{Path: att.NetNS}, DNS: att.DNS}
}

// detachNetwork releases a sandbox's network, logging failures (Cleanup at
// the next start retries).
func (m *Manager) detachNetwork(ctx context.Context, id string) {
	if m.cfg.Network == nil {
		return
	}
	if err := m.cfg.Network.Detach(ctx, id); err != nil {
		m.log.Warn("releasing sandbox network", "sandbox", id, "err", err)
	}
}

func ipString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}
