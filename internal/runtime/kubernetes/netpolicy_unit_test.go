package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/network"
	"github.com/sbxdev/sbx/internal/podfw"
	"github.com/sbxdev/sbx/internal/runtime"
)

func unitDriver(cluster ...string) *Driver {
	d := &Driver{cfg: Config{Name: "kubernetes", Instance: "default", Namespace: "ns", AgentImage: "agent:1", Firewall: podfw.BackendNFTables}}
	for _, c := range cluster {
		d.cfg.ClusterCIDRs = append(d.cfg.ClusterCIDRs, netip.MustParsePrefix(c))
	}
	return d
}

func podSpec(mode string, allow, deny []string) runtime.Spec {
	s := runtime.Spec{ID: "box1", Image: runtime.Image{Ref: "img"}}
	if mode == "" {
		return s
	}
	pn := &runtime.PodNetwork{Mode: mode}
	for _, a := range allow {
		pn.Allow = append(pn.Allow, netip.MustParsePrefix(a))
	}
	for _, a := range deny {
		pn.Deny = append(pn.Deny, netip.MustParsePrefix(a))
	}
	s.Network = &runtime.Network{Pod: pn}
	return s
}

// egressString renders a policy's egress rules: "cidr except a,b [ports]".
func egressString(p *networkingv1.NetworkPolicy) []string {
	if p == nil {
		return nil
	}
	var out []string
	for _, e := range p.Spec.Egress {
		for _, to := range e.To {
			s := to.IPBlock.CIDR
			if len(to.IPBlock.Except) > 0 {
				s += " except " + strings.Join(to.IPBlock.Except, ",")
			}
			for _, port := range e.Ports {
				s += fmt.Sprintf(" %s/%s", *port.Protocol, port.Port)
			}
			out = append(out, s)
		}
	}
	return out
}

// TestUnitBoxNetworkPolicy: a box's pod policy as a NetworkPolicy, for
// CNIs that enforce one: public egress everywhere but the blocked ranges,
// deny_cidrs and the cluster's ranges, allow_cidrs holes that never open
// deny_cidrs or the cluster, DNS on port 53; allow mode only its ranges.
func TestUnitBoxNetworkPolicy(t *testing.T) {
	var blocked []string
	for _, b := range network.BlockedRanges() {
		blocked = append(blocked, b.String())
	}
	pod := &corev1.Pod{}
	pod.Name, pod.UID = "sbx-box1", "uid-1"
	for _, tc := range []struct {
		name        string
		cluster     []string
		spec        runtime.Spec
		want        []string
		wantNoObj   bool
		wantNoOwner bool
	}{
		{name: "none", spec: podSpec("", nil, nil), wantNoObj: true},
		{name: "public", cluster: []string{"10.96.0.0/16"}, spec: podSpec(runtime.PodPublic, []string{"10.1.0.0/16"}, []string{"203.0.113.0/24", "10.1.2.0/24"}),
			want: []string{
				"0.0.0.0/0 except " + strings.Join(mergedStrings(append(blocked, "203.0.113.0/24", "10.1.2.0/24", "10.96.0.0/16")), ","),
				"10.1.0.0/16 except 10.1.2.0/24",
				"0.0.0.0/0 except 10.1.2.0/24,203.0.113.0/24 UDP/53 TCP/53",
			}},
		{name: "allow", cluster: []string{"10.244.0.0/16"}, spec: podSpec(runtime.PodAllow, []string{"203.0.113.7/32", "10.0.0.0/8", "10.244.1.0/24"}, nil),
			want: []string{"10.0.0.0/8 except 10.244.0.0/16", "203.0.113.7/32"}},
		{name: "allow inside the cluster", cluster: []string{"10.244.0.0/16"}, spec: podSpec(runtime.PodAllow, []string{"10.244.1.0/24"}, nil), wantNoObj: true},
		{name: "allow inside deny", spec: podSpec(runtime.PodAllow, []string{"203.0.113.7/32"}, []string{"203.0.113.0/24"}), wantNoObj: true},
	} {
		p := unitDriver(tc.cluster...).boxNetworkPolicy(tc.spec, pod)
		if tc.wantNoObj {
			if p != nil {
				t.Errorf("%s: got policy with egress %q, want none", tc.name, egressString(p))
			}
			continue
		}
		if p == nil {
			t.Fatalf("%s: got no policy, want egress %q", tc.name, tc.want)
		}
		if got := egressString(p); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: egress\n got %q\nwant %q", tc.name, got, tc.want)
		}
		if got := fmt.Sprint(p.Spec.PolicyTypes); got != "[Egress]" {
			t.Errorf("%s: policy types %s, want [Egress]", tc.name, got)
		}
		if got := p.Spec.PodSelector.MatchLabels[labelID]; got != "box1" || p.Name != "sbx-box1-egress" {
			t.Errorf("%s: name %s selecting box %q, want sbx-box1-egress selecting box1", tc.name, p.Name, got)
		}
		if o := p.OwnerReferences; len(o) != 1 || o[0].Kind != "Pod" || o[0].UID != "uid-1" {
			t.Errorf("%s: owners %+v, want the box's pod", tc.name, o)
		}
	}
}

func mergedStrings(ss []string) []string {
	var ps []netip.Prefix
	for _, s := range ss {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	var out []string
	for _, p := range network.DisjointPrefixes(ps) {
		out = append(out, p.String())
	}
	return out
}

// TestUnitFirewallCommand: the pod's firewall init container runs the
// box's mode with its lists, the cluster's ranges and (public) the
// blocked ranges, and learns its node's address from the downward API.
func TestUnitFirewallCommand(t *testing.T) {
	block := ""
	for _, b := range network.BlockedRanges() {
		block += " -block " + b.String()
	}
	for _, tc := range []struct {
		name string
		spec runtime.Spec
		want string
	}{
		{"none", podSpec("", nil, nil), "/sbx-agent sbx-firewall nftables none 7700 7701"},
		{"public", podSpec(runtime.PodPublic, []string{"10.1.0.0/16"}, []string{"203.0.113.0/24"}),
			"/sbx-agent sbx-firewall nftables public -deny 203.0.113.0/24 -never 10.96.0.0/16 -allow 10.1.0.0/16" + block + " 7700 7701"},
		{"allow", podSpec(runtime.PodAllow, []string{"203.0.113.7/32"}, nil),
			"/sbx-agent sbx-firewall nftables allow -never 10.96.0.0/16 -allow 203.0.113.7/32 7700 7701"},
	} {
		c := unitDriver("10.96.0.0/16").pod(tc.spec).Spec.InitContainers[0]
		if got := strings.Join(c.Command, " "); c.Name != "sbx-firewall" || got != tc.want {
			t.Errorf("%s: init container %s runs %q, want sbx-firewall running %q", tc.name, c.Name, got, tc.want)
		}
		if len(c.Env) != 1 || c.Env[0].Name != "SBX_NODE_IP" || c.Env[0].ValueFrom == nil || c.Env[0].ValueFrom.FieldRef.FieldPath != "status.hostIP" {
			t.Errorf("%s: firewall env %+v, want SBX_NODE_IP from status.hostIP", tc.name, c.Env)
		}
	}
}

// TestUnitClusterCIDRsInvalid: New refuses cluster ranges the pod
// firewall cannot hold, naming them (no cluster needed).
func TestUnitClusterCIDRsInvalid(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cidrs []netip.Prefix
		want  string
	}{
		{"ipv6", []netip.Prefix{netip.MustParsePrefix("fd00::/8")}, `cluster CIDR "fd00::/8": want IPv4`},
		{"zero", []netip.Prefix{{}}, `cluster CIDR "invalid Prefix"`},
		{"too many", make([]netip.Prefix, runtime.MaxPodNetworkEntries+1), "1025 cluster CIDRs"},
	} {
		_, err := New(context.Background(), Config{Client: fake.NewSimpleClientset(), Namespace: "ns", AgentImage: "agent", ClusterCIDRs: tc.cidrs})
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: New: got %v, want InvalidArgument containing %q", tc.name, err, tc.want)
		}
	}
}
