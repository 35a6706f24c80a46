package runtime

import (
	"fmt"
	"net"
	"net/netip"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// Spec is everything a driver needs to create a box. It is data: what the
// box is made of (an image by digest and typed layers, typed mounts, a
// typed network attachment), not how one driver makes it. Each driver
// realises it its own way; the oci and gvisor drivers stack the unpacked
// layer dirs in an overlay, a VM driver could build a block image from the
// same layers, a Kubernetes driver pull the image by digest.
type Spec struct {
	// ID is the sandbox id: unique, [a-z0-9-], at most 32 bytes. Drivers use
	// it to name host resources.
	ID string
	// Image is the root filesystem to run.
	Image Image
	// Env is the environment of the agent and, by default, of every command.
	Env []string
	// Workdir is the initial working directory ("/" if empty).
	Workdir string
	// Command is an optional long-running command the agent starts at boot.
	Command []string
	// Hostname of the box (default: ID).
	Hostname  string
	Resources Resources
	// Network is how the box reaches the network; nil: loopback only.
	Network *Network
	// Mounts are trees shown in the box (nosuid, nodev), in order. See
	// ValidateMountPath for the destinations allowed.
	Mounts []Mount
	// Meta describes the sandbox for drivers that label what they make
	// (kubernetes: the pod's labels and annotations); others ignore it.
	Meta Meta
}

// Meta is what a sandbox is to its users: its name, tenant, labels and the
// end of its lifetime. Informational: no driver decides anything by it.
type Meta struct {
	Name   string
	Tenant string
	Labels map[string]string
	// Expires is when the sandbox's lifetime ends (zero: no limit).
	Expires time.Time
}

// Validate checks what every driver must before making anything: the
// image (Image.Validate), the mounts (ValidateMounts) and the network
// (Network.Validate). Errors wrap errdefs.ErrInvalidArgument.
func (s Spec) Validate() error {
	if err := s.Image.Validate(); err != nil {
		return err
	}
	if err := ValidateMounts(s.Mounts); err != nil {
		return err
	}
	return s.Network.Validate()
}

// Image describes a box's root filesystem: which image (Ref, Digest) and
// what it is made of (Layers, on the built-in host image if Host is set).
type Image struct {
	// Ref is the reference the user gave ("python:3.12", "host"), for
	// humans and logs; drivers do not interpret it.
	Ref string
	// Digest is the image's manifest digest ("sha256:<hex>"); "" for the
	// built-in host image, which has none.
	Digest string
	// Host, if set, is the base the layers stack on: the built-in host
	// image. Alone (no Layers) it is the "host" image; with Layers, an
	// image snapshotted from a host-image sandbox. Needs CapHostImage.
	Host *HostImage
	// Layers are the image's filesystem layers, lowest first. An image
	// without Host has at least one.
	Layers []Layer
}

// HostImage is the built-in host image: a skeleton root (internal/hostimage:
// /etc, /tmp, mount points, the agent's dirs) with the host's /usr bound
// read-only over its /usr, so a box runs the host's tools without an image
// pull. Its files are the host's; the driver makes the skeleton itself,
// owned in its StoredIDs range.
type HostImage struct{}

// Layer is one filesystem layer of an image.
type Layer struct {
	// Digest is the layer's uncompressed content digest (its OCI diff id,
	// "sha256:<hex>"): what it is, for drivers that fetch or cache layers
	// by content.
	Digest string
	// Dir is the layer unpacked on the host: an absolute, read-only
	// directory, owners stored in the drivers' StoredIDs range, whiteouts
	// as overlayfs writes them. The caller keeps it until the box is gone.
	// The oci and gvisor drivers stack these dirs in an overlay.
	Dir string
}

var digestRe = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// Validate checks the image is well formed: a host image or at least one
// layer, every layer dir absolute and every digest given well formed.
// Errors wrap errdefs.ErrInvalidArgument.
func (img Image) Validate() error {
	if img.Host == nil && len(img.Layers) == 0 {
		return fmt.Errorf("image %q: no layers and not on the host image: %w", img.Ref, errdefs.ErrInvalidArgument)
	}
	if img.Digest != "" && !digestRe.MatchString(img.Digest) {
		return fmt.Errorf("image %q: digest %q: want sha256:<64 hex>: %w", img.Ref, img.Digest, errdefs.ErrInvalidArgument)
	}
	for i, l := range img.Layers {
		if !filepath.IsAbs(l.Dir) {
			return fmt.Errorf("image %q layer %d: dir %q: must be absolute: %w", img.Ref, i, l.Dir, errdefs.ErrInvalidArgument)
		}
		if l.Digest != "" && !digestRe.MatchString(l.Digest) {
			return fmt.Errorf("image %q layer %d: digest %q: want sha256:<64 hex>: %w", img.Ref, i, l.Digest, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// LayerDirs returns the layers' host dirs, lowest first.
func (img Image) LayerDirs() []string {
	out := make([]string, len(img.Layers))
	for i, l := range img.Layers {
		out[i] = l.Dir
	}
	return out
}

// Mount is one tree shown in a box at Destination. Exactly one of Volume,
// Codebase and Files says what the tree is; each is realised by the driver
// (the oci driver through idmapped binds and overlays, gvisor through its
// gofer).
type Mount struct {
	// Destination is an absolute path inside the box.
	Destination string
	ReadOnly    bool
	// Volume is a named volume (CapVolumes).
	Volume *VolumeMount
	// Codebase is a codebase's copy-on-write view (CapCodebases).
	Codebase *CodebaseMount
	// Files are read-only files the daemon provides the box (the egress
	// proxy's CA bundle): every driver takes them.
	Files *FilesMount
}

// VolumeMount is a named volume: a directory tree on the host that outlives
// boxes, owners stored in the StoredIDs range.
type VolumeMount struct {
	// Name is the volume's name, for errors.
	Name string
	// Dir is its root, an absolute host path.
	Dir string
}

// CodebaseMount is a codebase as one box sees it: Lower (the codebase,
// read-only) under Upper (this box's changes, which the host reads back),
// Work the overlay's work dir on Upper's filesystem. All are absolute host
// paths the caller owns and keeps until the box is gone. A driver assembles
// the overlay itself: drivers that show boxes stored trees through
// idmapped layers need the layers, not an overlay mount, which cannot be
// idmapped.
type CodebaseMount struct {
	// Name is the codebase's name, for errors.
	Name               string
	Lower, Upper, Work string
}

// FilesMount is a directory of daemon-provided files, bound read-only.
type FilesMount struct {
	// Dir is an absolute host path.
	Dir string
}

// sources returns m's host paths and its kind, or an error if not exactly
// one kind is set.
func (m Mount) sources() (kind string, srcs []string, err error) {
	n := 0
	if m.Volume != nil {
		n, kind, srcs = n+1, "volume "+m.Volume.Name, []string{m.Volume.Dir}
	}
	if m.Codebase != nil {
		n, kind, srcs = n+1, "codebase "+m.Codebase.Name, []string{m.Codebase.Lower, m.Codebase.Upper, m.Codebase.Work}
	}
	if m.Files != nil {
		n, kind, srcs = n+1, "files", []string{m.Files.Dir}
	}
	if n != 1 {
		return "", nil, fmt.Errorf("mount at %s: want exactly one of volume, codebase and files, got %d", m.Destination, n)
	}
	return kind, srcs, nil
}

// ValidateMounts checks a spec's mounts as every driver must before making
// anything: each has one kind, each destination passes ValidateMountPath
// and each host source is absolute. Errors wrap errdefs.ErrInvalidArgument.
func ValidateMounts(ms []Mount) error {
	for _, m := range ms {
		if err := ValidateMountPath(m.Destination); err != nil {
			return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
		}
		kind, srcs, err := m.sources()
		if err != nil {
			return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
		}
		if m.Files != nil && !m.ReadOnly {
			return fmt.Errorf("files mount at %s: must be read-only: %w", m.Destination, errdefs.ErrInvalidArgument)
		}
		for _, src := range srcs {
			if !filepath.IsAbs(src) {
				return fmt.Errorf("%s mount source %q at %s: must be absolute: %w", kind, src, m.Destination, errdefs.ErrInvalidArgument)
			}
		}
	}
	return nil
}

// ValidateMountPath checks a mount destination: absolute, clean, and not /
// or inside /proc, /sys, /dev or /.sbx.
func ValidateMountPath(p string) error {
	if !path.IsAbs(p) {
		return fmt.Errorf("mount path %q: must be absolute", p)
	}
	if path.Clean(p) != p {
		return fmt.Errorf("mount path %q: must be clean (%q)", p, path.Clean(p))
	}
	if p == "/" {
		return fmt.Errorf("mount path %q: cannot mount over the root", p)
	}
	for _, r := range []string{"/proc", "/sys", "/dev", "/.sbx"} {
		if p == r || strings.HasPrefix(p, r+"/") {
			return fmt.Errorf("mount path %q: %s is reserved", p, r)
		}
	}
	return nil
}

// Network is a box's network attachment. Exactly one kind is set; each
// driver takes the kinds it declares (CapNetwork: NetNS; CapPodNetwork:
// Pod). More kinds (a tap device for a VM) come with the drivers that need
// them.
type Network struct {
	// NetNS is a network namespace the daemon made for the box (veth,
	// addresses, firewall), owned by the host's user namespace so the box
	// cannot reconfigure it: the box joins it.
	NetNS *NetNS
	// Pod is a policy the driver enforces itself, in a network of its own
	// (a kubernetes pod's), without the daemon's namespace, bridge or DNS
	// forwarder.
	Pod *PodNetwork
	// DNS lists nameservers written to the box's /etc/resolv.conf (none:
	// the image's file is left alone). Only with NetNS: a pod keeps the
	// nameservers its cluster gives it.
	DNS []string
}

// NetNS names a network namespace on the host.
type NetNS struct {
	// Path is its bind mount (an absolute host path).
	Path string
}

// Pod network modes. Mode none is no Network at all (loopback only).
const (
	// PodPublic: the internet, but not the blocked ranges (private,
	// shared, link-local, multicast, reserved) unless Allow opens them,
	// and never the cluster itself (its node, pods, services and API
	// server) whatever Allow says; Deny first.
	PodPublic = "public"
	// PodAllow: only Allow, never the cluster itself; Deny first.
	PodAllow = "allow"
)

// MaxPodNetworkEntries bounds PodNetwork's lists, as the API bounds a
// policy's (each entry is a firewall rule in the pod).
const MaxPodNetworkEntries = 1024

// PodNetwork is a box's network policy for a driver that enforces it
// itself (CapPodNetwork). It has no domains: allow-listed names need the
// daemon's DNS forwarder, which such a box does not reach.
type PodNetwork struct {
	// Mode is PodPublic or PodAllow.
	Mode string
	// Allow: in PodAllow the ranges the box reaches; in PodPublic holes in
	// the blocked ranges. IPv4, masked.
	Allow []netip.Prefix
	// Deny is unreachable in every mode, before anything is allowed.
	// IPv4, masked.
	Deny []netip.Prefix
}

// NetNSPath returns the namespace path of n's NetNS ("" for none: a nil
// Network or another kind).
func (n *Network) NetNSPath() string {
	if n == nil || n.NetNS == nil {
		return ""
	}
	return n.NetNS.Path
}

// Nameservers returns n's DNS servers (none for a nil Network).
func (n *Network) Nameservers() []string {
	if n == nil {
		return nil
	}
	return n.DNS
}

// Validate checks a (possibly nil) attachment: one kind; a namespace's
// absolute path and DNS servers that are IP addresses; a pod policy's
// mode and its bounded lists of masked IPv4 prefixes, without DNS servers.
// Errors wrap errdefs.ErrInvalidArgument.
func (n *Network) Validate() error {
	if n == nil {
		return nil
	}
	switch {
	case n.NetNS == nil && n.Pod == nil:
		return fmt.Errorf("network attachment names no kind (want a network namespace or a pod policy): %w", errdefs.ErrInvalidArgument)
	case n.NetNS != nil && n.Pod != nil:
		return fmt.Errorf("network attachment names two kinds (a network namespace and a pod policy), want one: %w", errdefs.ErrInvalidArgument)
	case n.Pod != nil:
		if len(n.DNS) > 0 {
			return fmt.Errorf("pod network with dns servers %q: a pod keeps its cluster's nameservers: %w", n.DNS, errdefs.ErrInvalidArgument)
		}
		return n.Pod.validate()
	}
	if !filepath.IsAbs(n.NetNS.Path) {
		return fmt.Errorf("network namespace %q: must be an absolute path: %w", n.NetNS.Path, errdefs.ErrInvalidArgument)
	}
	for _, ns := range n.DNS {
		if net.ParseIP(ns) == nil {
			return fmt.Errorf("dns server %q: %w", ns, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

func (p *PodNetwork) validate() error {
	if p.Mode != PodPublic && p.Mode != PodAllow {
		return fmt.Errorf("pod network mode %q: want %q or %q (mode none is no network): %w", p.Mode, PodPublic, PodAllow, errdefs.ErrInvalidArgument)
	}
	for _, l := range []struct {
		field string
		ps    []netip.Prefix
	}{{"allow", p.Allow}, {"deny", p.Deny}} {
		field, ps := l.field, l.ps
		if len(ps) > MaxPodNetworkEntries {
			return fmt.Errorf("pod network %s: %d entries, at most %d: %w", field, len(ps), MaxPodNetworkEntries, errdefs.ErrInvalidArgument)
		}
		for _, c := range ps {
			if !c.IsValid() || !c.Addr().Is4() || c != c.Masked() {
				return fmt.Errorf("pod network %s entry %q: want a masked IPv4 prefix: %w", field, c, errdefs.ErrInvalidArgument)
			}
		}
	}
	return nil
}
