package sandbox

import (
	"context"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
)

// podNetDriver is the fake as a driver that enforces network policies
// itself (CapPodNetwork instead of CapNetwork, as kubernetes), recording
// the networks it is given.
type podNetDriver struct {
	runtime.Driver
	mu   *sync.Mutex
	nets map[string]*runtime.Network
}

func (p podNetDriver) Info(ctx context.Context) runtime.Info {
	info := p.Driver.Info(ctx)
	info.Capabilities = append(slices.DeleteFunc(slices.Clone(info.Capabilities), func(c runtime.Capability) bool {
		return c == runtime.CapNetwork || c == runtime.CapNetworkReplug
	}), runtime.CapPodNetwork)
	return info
}

func (p podNetDriver) Create(ctx context.Context, spec runtime.Spec) (runtime.Handle, error) {
	p.mu.Lock()
	p.nets[spec.Meta.Name] = spec.Network
	p.mu.Unlock()
	spec.Network = nil // the fake runs host processes
	return p.Driver.Create(ctx, spec)
}

// TestPodNetworkPolicy: on a runtime with pod-network the manager hands a
// create's public or allow-listed policy to the driver as Spec.Network.Pod
// (none: no network, also the default there), reports it, keeps reporting
// it after a daemon restart, and refuses what such a runtime cannot do
// (allow_domains, domain secrets, changing the policy) by capability,
// leaving nothing behind.
func TestPodNetworkPolicy(t *testing.T) {
	e := &env{t: t, dir: t.TempDir()}
	nets := map[string]*runtime.Network{}
	var mu sync.Mutex
	wrap := func(d runtime.Driver) runtime.Driver { return podNetDriver{d, &mu, nets} }
	e.open(wrap)
	t.Cleanup(e.close)
	ctx := context.Background()
	pfx := func(s string) []netip.Prefix { return []netip.Prefix{netip.MustParsePrefix(s)} }
	for _, tc := range []struct {
		name string
		pol  *sbxv1.NetworkPolicy
		want *runtime.Network
		mode sbxv1.NetworkMode
	}{
		{"dflt", nil, nil, sbxv1.NetworkMode_NETWORK_MODE_NONE},
		{"none", &sbxv1.NetworkPolicy{Mode: sbxv1.NetworkMode_NETWORK_MODE_NONE}, nil, sbxv1.NetworkMode_NETWORK_MODE_NONE},
		{"public", &sbxv1.NetworkPolicy{Mode: sbxv1.NetworkMode_NETWORK_MODE_PUBLIC, AllowCidrs: []string{"10.1.0.0/16"}, DenyCidrs: []string{"203.0.113.9"}},
			&runtime.Network{Pod: &runtime.PodNetwork{Mode: runtime.PodPublic, Allow: pfx("10.1.0.0/16"), Deny: pfx("203.0.113.9/32")}},
			sbxv1.NetworkMode_NETWORK_MODE_PUBLIC},
		{"allow", &sbxv1.NetworkPolicy{Mode: sbxv1.NetworkMode_NETWORK_MODE_ALLOW, AllowCidrs: []string{"203.0.113.0/24"}},
			&runtime.Network{Pod: &runtime.PodNetwork{Mode: runtime.PodAllow, Allow: pfx("203.0.113.0/24")}},
			sbxv1.NetworkMode_NETWORK_MODE_ALLOW},
	} {
		sb, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{Name: tc.name, Network: tc.pol})
		if err != nil {
			t.Fatalf("%s: Create: %v", tc.name, err)
		}
		mu.Lock()
		got := nets[tc.name]
		mu.Unlock()
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: driver's network: got %+v, want %+v", tc.name, got, tc.want)
		}
		if m := sb.GetNetwork().GetMode(); m != tc.mode {
			t.Errorf("%s: reported mode %v, want %v", tc.name, m, tc.mode)
		}
	}
	refused := []struct {
		name string
		req  *sbxv1.CreateSandboxRequest
	}{
		{"domains", &sbxv1.CreateSandboxRequest{Name: "domains", Network: &sbxv1.NetworkPolicy{Mode: sbxv1.NetworkMode_NETWORK_MODE_ALLOW, AllowDomains: []string{"example.com"}}}},
		{"secrets", &sbxv1.CreateSandboxRequest{Name: "secrets", Network: &sbxv1.NetworkPolicy{Mode: sbxv1.NetworkMode_NETWORK_MODE_PUBLIC},
			DomainSecrets: []*sbxv1.DomainSecret{{Name: "K", Value: "v", Domains: []string{"example.com"}}}}},
	}
	for _, tc := range refused {
		_, err := e.mgr.Create(ctx, tc.req)
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), `"network" capability`) {
			t.Errorf("%s: Create: got %v, want FailedPrecondition naming the network capability", tc.name, err)
		}
	}
	if _, err := e.mgr.UpdateNetwork(ctx, "public", &sbxv1.NetworkPolicy{Mode: sbxv1.NetworkMode_NETWORK_MODE_ALLOW}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("UpdateNetwork: got %v, want FailedPrecondition", err)
	}
	if list, _ := e.mgr.List(ctx, nil); len(list) != 4 {
		t.Errorf("sandboxes after the refusals: %d, want 4", len(list))
	}

	// A restarted daemon reports what the boxes' drivers still enforce.
	e.restart(wrap)
	for name, want := range map[string]sbxv1.NetworkMode{"dflt": sbxv1.NetworkMode_NETWORK_MODE_NONE,
		"public": sbxv1.NetworkMode_NETWORK_MODE_PUBLIC, "allow": sbxv1.NetworkMode_NETWORK_MODE_ALLOW} {
		sb, err := e.mgr.Get(ctx, name)
		if err != nil {
			t.Fatalf("Get %s after a restart: %v", name, err)
		}
		if m := sb.GetNetwork().GetMode(); m != want {
			t.Errorf("%s after a restart: mode %v, want %v", name, m, want)
		}
	}
}
