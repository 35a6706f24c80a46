package runtime

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/sbxdev/sbx/internal/errdefs"
)

func TestSpecValidate(t *testing.T) {
	const d = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	host := Image{Ref: "host", Host: &HostImage{}}
	vol := func(dst, dir string) Mount { return Mount{Destination: dst, Volume: &VolumeMount{Name: "v", Dir: dir}} }
	for _, tc := range []struct {
		name    string
		spec    Spec
		wantErr string // "" = valid
	}{
		{name: "host image", spec: Spec{Image: host}},
		{name: "layers", spec: Spec{Image: Image{Ref: "x", Digest: d, Layers: []Layer{{Digest: d, Dir: "/l/1"}}}}},
		{name: "layers on host", spec: Spec{Image: Image{Ref: "snap", Host: &HostImage{}, Layers: []Layer{{Dir: "/l/1"}}}}},
		{name: "no image", spec: Spec{Image: Image{Ref: "host"}}, wantErr: `image "host": no layers and not on the host image`},
		{name: "relative layer", spec: Spec{Image: Image{Ref: "x", Layers: []Layer{{Dir: "l/1"}}}}, wantErr: `layer 0: dir "l/1": must be absolute`},
		{name: "bad layer digest", spec: Spec{Image: Image{Ref: "x", Layers: []Layer{{Digest: "md5:1", Dir: "/l"}}}}, wantErr: `digest "md5:1"`},
		{name: "bad image digest", spec: Spec{Image: Image{Ref: "x", Digest: "sha256:XY", Layers: []Layer{{Dir: "/l"}}}}, wantErr: `digest "sha256:XY"`},
		{name: "volume", spec: Spec{Image: host, Mounts: []Mount{vol("/data", "/v")}}},
		{name: "codebase", spec: Spec{Image: host, Mounts: []Mount{{Destination: "/src", Codebase: &CodebaseMount{Name: "c", Lower: "/a", Upper: "/b/u", Work: "/b/w"}}}}},
		{name: "files", spec: Spec{Image: host, Mounts: []Mount{{Destination: "/etc/ca", ReadOnly: true, Files: &FilesMount{Dir: "/ca"}}}}},
		{name: "files writable", spec: Spec{Image: host, Mounts: []Mount{{Destination: "/etc/ca", Files: &FilesMount{Dir: "/ca"}}}}, wantErr: "must be read-only"},
		{name: "mount without kind", spec: Spec{Image: host, Mounts: []Mount{{Destination: "/x"}}}, wantErr: "want exactly one of volume, codebase and files, got 0"},
		{name: "mount with two kinds", spec: Spec{Image: host, Mounts: []Mount{{Destination: "/x", Volume: &VolumeMount{Dir: "/v"}, Files: &FilesMount{Dir: "/f"}}}}, wantErr: "got 2"},
		{name: "relative volume", spec: Spec{Image: host, Mounts: []Mount{vol("/data", "v")}}, wantErr: `volume v mount source "v" at /data: must be absolute`},
		{name: "relative codebase", spec: Spec{Image: host, Mounts: []Mount{{Destination: "/src", Codebase: &CodebaseMount{Name: "c", Lower: "/a", Upper: "u", Work: "/w"}}}}, wantErr: `codebase c mount source "u"`},
		{name: "reserved destination", spec: Spec{Image: host, Mounts: []Mount{vol("/proc/x", "/v")}}, wantErr: "/proc is reserved"},
		{name: "network", spec: Spec{Image: host, Network: &Network{NetNS: &NetNS{Path: "/run/netns/x"}, DNS: []string{"10.0.0.1"}}}},
		{name: "network without kind", spec: Spec{Image: host, Network: &Network{DNS: []string{"10.0.0.1"}}}, wantErr: "names no kind"},
		{name: "pod public", spec: Spec{Image: host, Network: &Network{Pod: &PodNetwork{Mode: PodPublic, Deny: []netip.Prefix{netip.MustParsePrefix("1.2.3.0/24")}}}}},
		{name: "pod allow", spec: Spec{Image: host, Network: &Network{Pod: &PodNetwork{Mode: PodAllow, Allow: []netip.Prefix{netip.MustParsePrefix("1.2.3.4/32")}}}}},
		{name: "pod mode none", spec: Spec{Image: host, Network: &Network{Pod: &PodNetwork{Mode: "none"}}}, wantErr: `pod network mode "none"`},
		{name: "pod and netns", spec: Spec{Image: host, Network: &Network{NetNS: &NetNS{Path: "/n"}, Pod: &PodNetwork{Mode: PodPublic}}}, wantErr: "names two kinds"},
		{name: "pod with dns", spec: Spec{Image: host, Network: &Network{Pod: &PodNetwork{Mode: PodPublic}, DNS: []string{"10.0.0.1"}}}, wantErr: "keeps its cluster's nameservers"},
		{name: "pod ipv6", spec: Spec{Image: host, Network: &Network{Pod: &PodNetwork{Mode: PodAllow, Allow: []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}}}}, wantErr: `allow entry "2001:db8::/32"`},
		{name: "pod unmasked", spec: Spec{Image: host, Network: &Network{Pod: &PodNetwork{Mode: PodPublic, Deny: []netip.Prefix{netip.MustParsePrefix("1.2.3.4/24")}}}}, wantErr: `deny entry "1.2.3.4/24"`},
		{name: "pod too many", spec: Spec{Image: host, Network: &Network{Pod: &PodNetwork{Mode: PodAllow, Allow: make([]netip.Prefix, MaxPodNetworkEntries+1)}}}, wantErr: "1025 entries"},
		{name: "relative netns", spec: Spec{Image: host, Network: &Network{NetNS: &NetNS{Path: "x"}}}, wantErr: `network namespace "x": must be an absolute path`},
		{name: "bad dns", spec: Spec{Image: host, Network: &Network{NetNS: &NetNS{Path: "/n"}, DNS: []string{"dns.example"}}}, wantErr: `dns server "dns.example"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.spec.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate: %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Validate: got %v, want InvalidArgument saying %q", err, tc.wantErr)
			}
		})
	}
}

func TestNetworkAccessors(t *testing.T) {
	var none *Network
	if got := none.NetNSPath(); got != "" {
		t.Errorf("nil network: NetNSPath = %q, want \"\"", got)
	}
	if got := none.Nameservers(); got != nil {
		t.Errorf("nil network: Nameservers = %v, want none", got)
	}
	n := &Network{NetNS: &NetNS{Path: "/n"}, DNS: []string{"10.0.0.1"}}
	if got := n.NetNSPath(); got != "/n" {
		t.Errorf("NetNSPath = %q, want /n", got)
	}
}
