package kubernetes_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime/kubernetes"
)

// TestFirewallConfig: New takes the two pod firewall backends (none given
// is nftables) and refuses others by name, and Info names the one in use
// (no cluster needed).
func TestFirewallConfig(t *testing.T) {
	for _, tc := range []struct {
		firewall, want, wantErr string
	}{
		{firewall: "", want: "pod firewall nftables"},
		{firewall: "nftables", want: "pod firewall nftables"},
		{firewall: "iptables", want: "pod firewall iptables"},
		{firewall: "ebpf", wantErr: `firewall backend "ebpf"`},
		{firewall: "none", wantErr: `firewall backend "none"`},
	} {
		d, err := kubernetes.New(context.Background(), kubernetes.Config{
			Client: fake.NewSimpleClientset(), Namespace: "ns", AgentImage: "agent", Firewall: tc.firewall,
		})
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("New with firewall %q: got %v, want InvalidArgument containing %q", tc.firewall, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("New with firewall %q: %v", tc.firewall, err)
		}
		if got := d.Info(context.Background()).Detail; !strings.Contains(got, tc.want) {
			t.Errorf("firewall %q: Info detail %q, want it to contain %q", tc.firewall, got, tc.want)
		}
	}
}
