package sandbox

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/network"
)

// recordingNet is a Network that keeps each sandbox's policy in memory
// across manager restarts, as network.Manager keeps it in state.json.
type recordingNet struct {
	mu  sync.Mutex
	pol map[string]network.Policy
}

func (n *recordingNet) att(p network.Policy) network.Attachment {
	a := network.Attachment{Policy: p, NetNS: "/nonexistent/netns"} // the fake driver joins nothing
	if p.Mode != network.ModeNone {
		a.IP = netip.MustParseAddr("10.9.0.2")
	}
	return a
}

func (n *recordingNet) Attach(_ context.Context, id string, p network.Policy) (network.Attachment, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.pol[id] = p
	return n.att(p), nil
}

func (n *recordingNet) Update(ctx context.Context, id string, p network.Policy) (network.Attachment, error) {
	return n.Attach(ctx, id, p)
}

func (n *recordingNet) Recover(_ context.Context, id string, _ []network.Secret) (network.Attachment, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p, ok := n.pol[id]
	if !ok {
		return network.Attachment{}, errdefs.ErrNotFound
	}
	return n.att(p), nil
}

func (n *recordingNet) Detach(_ context.Context, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.pol, id)
	return nil
}

func (n *recordingNet) Cleanup(context.Context, map[string]bool) error { return nil }
func (n *recordingNet) Stats(string) (network.Stats, error)            { return network.Stats{}, nil }
func (n *recordingNet) Placeholder(id, name string) string             { return "placeholder-" + name }
func (n *recordingNet) CABundleDir() string                            { return "" }

// TestUpdateNetworkRecordedAcrossRestart: a policy set by UpdateNetwork is
// in the sandbox's record, so a restarted daemon's spec of the sandbox
// holds it (before, only the network's own state kept it and the record
// still had the create's policy).
func TestUpdateNetworkRecordedAcrossRestart(t *testing.T) {
	e := &env{t: t, dir: t.TempDir(), net: &recordingNet{pol: map[string]network.Policy{}}}
	e.open(nil)
	t.Cleanup(e.close)
	ctx := context.Background()
	sb, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := &sbxv1.NetworkPolicy{Mode: sbxv1.NetworkMode_NETWORK_MODE_ALLOW, AllowCidrs: []string{"192.0.2.0/24"}}
	if _, err := e.mgr.UpdateNetwork(ctx, sb.GetId(), want); err != nil {
		t.Fatal(err)
	}
	e.restart(nil)
	got, err := e.mgr.Get(ctx, sb.GetId())
	if err != nil {
		t.Fatal(err)
	}
	if n := got.GetNetwork(); n.GetMode() != want.Mode || !slices.Equal(n.GetAllowCidrs(), want.AllowCidrs) {
		t.Errorf("network after restart: got %v, want %v", n, want)
	}
	b, err := e.mgr.lookup(ctx, sb.GetId())
	if err != nil {
		t.Fatal(err)
	}
	if n := b.spec().GetNetwork(); n.GetMode() != want.Mode || !slices.Equal(n.GetAllowCidrs(), want.AllowCidrs) {
		t.Errorf("network policy in the sandbox's record after restart: got %v, want %v", n, want)
	}
}
