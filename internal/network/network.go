// Package network owns sandbox networking on the host: one network namespace
// per sandbox (bind-mounted under the daemon's data dir), the Linux bridge
// the namespaces hang off through veth pairs, the addresses handed out on the
// bridge's subnet (IPAM, persisted as a small JSON file), the firewall rules
// (one nftables table owned by sbx) and the DNS forwarder sandboxes resolve
// names through. It imports nothing of sbx above internal/errdefs; the
// sandbox manager uses it through an interface and internal/daemon wires it.
//
// Topology: bridge (default sbx0, 10.213.0.1/16) ⇄ veth "sbx<hex>" ⇄ the
// box's "eth0" (10.213.x.y/16, default route via the bridge address). The
// namespace belongs to the host's user namespace, so root inside a box (root
// of its own user namespace only) cannot reconfigure it: no address, route,
// link or firewall changes, no raw sockets. Whatever holds the box's end
// of the veth anyway (runsc's sandbox process under gvisor keeps an
// AF_PACKET socket on it) cannot send as a neighbour either: the port guard
// (portguard_linux.go, a bridge-family table) lets in through each veth
// only IPv4 and ARP from its box's MAC and address.
//
// Policies (see Policy): NONE is a namespace with loopback only; PUBLIC lets
// traffic out through masquerading NAT except to the host itself, the
// sandbox subnet, private, shared, link-local, multicast and reserved ranges
// and deny_cidrs (allow_cidrs punch holes in the blocked ranges); ALLOW lets
// out only allow_cidrs and the addresses that names matching allow_domains
// resolve to through the forwarder. IPv6 is disabled inside boxes and
// dropped at the bridge.
//
// Firewall layout (table inet <Table>): a fixed set of chains and rules
// (rules.go) whatever the number of boxes; a box's policy is which of the
// table's sets hold its address (boxes, public, egress, api) and its
// elements in the concatenated sets allow, deny (box . range) and learned
// (box . address, with timeouts). A box's change is one nftables
// transaction of element additions and deletions; every batch is bounded
// (nft_linux.go). Sources not in the boxes set are dropped. Boxes cannot
// talk to each other: bridge ports are isolated and routed box-to-box
// traffic hits the subnet drop.
//
// Crash safety: every slot (namespace, veth, address, policy, owner) is
// written to state.json before it is configured on the host and removed
// from it only after the host resources are gone, so Cleanup can always
// find what a crash left behind. The file is replaced by rename but not
// fsynced: after a power loss nothing it describes survives either, and
// Cleanup reconciles it.
package network

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// Mode is a sandbox's network mode.
type Mode string

const (
	// ModeNone: loopback only.
	ModeNone Mode = "none"
	// ModePublic: the internet, but not the host, private ranges or other boxes.
	ModePublic Mode = "public"
	// ModeAllow: only allow-listed CIDRs and domains.
	ModeAllow Mode = "allow"
)

// Policy is what a sandbox may reach. Build it with ParsePolicy.
type Policy struct {
	Mode Mode `json:"mode"`
	// AllowCIDRs: with ModeAllow the reachable destinations; with
	// ModePublic holes punched into the blocked ranges. Never the host's
	// own addresses, whatever they cover (see boxRules).
	AllowCIDRs []netip.Prefix `json:"allow_cidrs,omitempty"`
	// AllowDomains (ModeAllow): names or "*.suffix" wildcards the DNS
	// forwarder answers; their addresses become reachable.
	AllowDomains []string `json:"allow_domains,omitempty"`
	// DenyCIDRs are blocked in every mode, before anything is allowed.
	DenyCIDRs []netip.Prefix `json:"deny_cidrs,omitempty"`
	// APIAccess opens the daemon's box API port on the gateway (Config
	// APIPort) to the box: it holds a scoped API token.
	APIAccess bool `json:"api_access,omitempty"`
	// Secrets are substituted by the egress proxy in requests to their
	// domains. Their values are never written to state.json: after a
	// daemon restart Recover is given them again.
	Secrets []Secret `json:"secrets,omitempty"`
}

// Secret is a value kept out of a sandbox: the box sees Placeholder (in
// its env), and the egress proxy puts Value in its place only in HTTPS
// requests (TLS it intercepts, re-originated to a server whose certificate
// verified) to hosts matching Domains, and there only in the Headers named
// and, with AllowQuery, the URL query. Over plain HTTP a request carrying
// the placeholder to those hosts is refused.
type Secret struct {
	Name        string   `json:"name"`
	Placeholder string   `json:"placeholder"`
	Value       string   `json:"-"`
	Domains     []string `json:"domains"`
	// Headers are canonical header names (textproto); empty means
	// DefaultSecretHeader only.
	Headers    []string `json:"headers,omitempty"`
	AllowQuery bool     `json:"allow_query,omitempty"`
}

// DefaultSecretHeader is where a domain secret goes when no header is named.
const DefaultSecretHeader = "Authorization"

// headers returns the header names s's value may go in.
func (s Secret) headers() []string {
	if len(s.Headers) == 0 {
		return []string{DefaultSecretHeader}
	}
	return s.Headers
}

// proxied reports whether a box's TCP to the egress ports goes through the
// egress proxy: always in ModeAllow (host names are checked), in
// ModePublic when it has secrets to substitute.
func (p Policy) proxied() bool {
	return p.Mode == ModeAllow || p.Mode == ModePublic && len(p.Secrets) > 0
}

// NormalizeDomain validates a host name or "*.suffix" pattern and returns
// it lower-cased without a trailing dot; errors wrap ErrInvalidArgument.
func NormalizeDomain(s string) (string, error) { return normalizePattern(s) }

// MaxPolicyEntries bounds each list of a policy: every entry becomes
// firewall state, set elements and proxy checks for the box.
const MaxPolicyEntries = 1024

// ParsePolicy validates a policy given as strings (mode "" means public).
// Errors wrap errdefs.ErrInvalidArgument and name the bad entry.
func ParsePolicy(mode string, allowCIDRs, allowDomains, denyCIDRs []string) (Policy, error) {
	for field, n := range map[string]int{"allow_cidrs": len(allowCIDRs), "allow_domains": len(allowDomains), "deny_cidrs": len(denyCIDRs)} {
		if n > MaxPolicyEntries {
			return Policy{}, fmt.Errorf("%s: %d entries, at most %d: %w", field, n, MaxPolicyEntries, errdefs.ErrInvalidArgument)
		}
	}
	p := Policy{Mode: Mode(strings.ToLower(mode))}
	if p.Mode == "" {
		p.Mode = ModePublic
	}
	switch p.Mode {
	case ModeNone:
		if len(allowCIDRs) > 0 || len(allowDomains) > 0 {
			return Policy{}, fmt.Errorf("network mode none allows nothing: drop allow_cidrs/allow_domains or use mode allow: %w", errdefs.ErrInvalidArgument)
		}
	case ModePublic:
		if len(allowDomains) > 0 {
			return Policy{}, fmt.Errorf("allow_domains %q: domain allowlists need mode allow (public reaches every domain): %w",
				allowDomains[0], errdefs.ErrInvalidArgument)
		}
	case ModeAllow:
	default:
		return Policy{}, fmt.Errorf("network mode %q: want none, public or allow: %w", mode, errdefs.ErrInvalidArgument)
	}
	var err error
	if p.AllowCIDRs, err = parseCIDRs("allow_cidrs", allowCIDRs, false); err != nil {
		return Policy{}, err
	}
	if p.DenyCIDRs, err = parseCIDRs("deny_cidrs", denyCIDRs, true); err != nil {
		return Policy{}, err
	}
	for _, d := range allowDomains {
		norm, err := normalizePattern(d)
		if err != nil {
			return Policy{}, err
		}
		p.AllowDomains = append(p.AllowDomains, norm)
	}
	return p, nil
}

// parseCIDRs parses CIDRs or bare addresses (as /32). IPv6 entries are
// accepted only where they are no-ops (deny: boxes have no IPv6).
func parseCIDRs(field string, in []string, allowV6 bool) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range in {
		s = strings.TrimSpace(s)
		var p netip.Prefix
		var err error
		if strings.Contains(s, "/") {
			p, err = netip.ParsePrefix(s)
		} else {
			var a netip.Addr
			if a, err = netip.ParseAddr(s); err == nil {
				p = netip.PrefixFrom(a, a.BitLen())
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%s entry %q: not a CIDR: %w", field, s, errdefs.ErrInvalidArgument)
		}
		p = p.Masked()
		if !p.Addr().Is4() {
			if allowV6 {
				continue // all IPv6 is dropped anyway
			}
			return nil, fmt.Errorf("%s entry %q: IPv6 is not supported (sandboxes have no IPv6): %w", field, s, errdefs.ErrInvalidArgument)
		}
		out = append(out, p)
	}
	return out, nil
}

// normalizePattern validates a domain or "*.domain" pattern and returns it
// lower-cased without a trailing dot.
func normalizePattern(s string) (string, error) {
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("allow_domains entry %q: %s: %w", s, why, errdefs.ErrInvalidArgument)
	}
	d := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(s)), ".")
	rest, wild := strings.CutPrefix(d, "*.")
	if rest == "" || len(d) > 253 {
		return bad("empty or too long")
	}
	labels := strings.Split(rest, ".")
	if len(labels) < 2 && wild {
		return bad(`a wildcard needs at least two labels after "*." (no "*.com")`)
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return bad("empty or over-long label")
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return bad(`only letters, digits, "-", "_" and a leading "*." are allowed`)
			}
		}
	}
	return d, nil
}

// MatchDomain reports whether name (any case, trailing dot optional) is
// allowed by one of the patterns: "example.com" matches only itself,
// "*.example.com" matches every name below example.com but not
// example.com itself.
func MatchDomain(patterns []string, name string) bool {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if !isDNSName(name) {
		return false
	}
	for _, p := range patterns {
		if suffix, ok := strings.CutPrefix(p, "*."); ok {
			if strings.HasSuffix(name, "."+suffix) {
				return true
			}
		} else if name == p {
			return true
		}
	}
	return false
}

// isDNSName reports whether name (without its trailing dot) is made of
// 1 to 63-byte labels, at most 253 bytes in all: only such a name reaches a
// resolver as the labels it reads as. "evil.test..allowed.test" (an empty
// label ends a name on the wire) or a label of 192 bytes or more (its length
// byte reads as a compression pointer) would be checked as one name and
// resolved as another.
func isDNSName(name string) bool {
	if name == "" || len(name) > 253 {
		return false
	}
	for l := range strings.SplitSeq(name, ".") {
		if l == "" || len(l) > 63 {
			return false
		}
	}
	return true
}

// Attachment is how a sandbox is attached to the network.
type Attachment struct {
	// NetNS is the path of the box's network namespace (a bind mount).
	NetNS string
	// IP is the box's address; invalid with ModeNone.
	IP netip.Addr
	// DNS lists the nameservers for the box's resolv.conf.
	DNS []string
	// Policy is the policy in force.
	Policy Policy
}

// Stats are a sandbox's traffic figures (zero with ModeNone).
type Stats struct {
	RxBytes, TxBytes     int64 // as seen by the box: rx = received
	RxPackets, TxPackets int64
	// Connections is the number of tracked connections from the box.
	Connections int64
}

// Defaults of Config.
const (
	DefaultBridge = "sbx0"
	DefaultSubnet = "10.213.0.0/16"
	DefaultTable  = "sbx"
	// DefaultLockDir holds the bridge and table locks (lock_linux.go).
	DefaultLockDir = "/run/sbx"
)

// blockedRanges are unreachable in ModePublic unless allow_cidrs say
// otherwise: "this network", RFC1918, CGNAT, loopback, link-local (cloud
// metadata), IETF protocol assignments, benchmarking, multicast, reserved
// and broadcast. The documentation ranges (192.0.2.0/24, 198.51.100.0/24,
// 203.0.113.0/24) are not routed on the internet and are left alone.
var blockedRanges = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
}

// BlockedRanges returns the ranges ModePublic does not reach unless
// allow_cidrs say otherwise (a copy): drivers that enforce policies
// themselves (the kubernetes pod firewall) block the same.
func BlockedRanges() []netip.Prefix { return slices.Clone(blockedRanges) }

// Config configures a Manager.
type Config struct {
	// StateDir holds state.json and the namespace bind mounts (ns/).
	StateDir string
	// Bridge is the bridge's name (default sbx0); Subnet its IPv4 subnet
	// (default 10.213.0.0/16; the first address is the gateway).
	Bridge string
	Subnet string
	// Table names the nftables table (family inet) sbx owns (default sbx).
	Table string
	// DNSUpstreams are the resolvers (host:port) the forwarder asks
	// (default: the nameservers of the host's /etc/resolv.conf).
	DNSUpstreams []string
	// PoolSize is how many ready namespaces with a veth to keep (0: none).
	PoolSize int
	// EgressPorts are the TCP destination ports sent through the egress
	// proxy (HTTP Host / TLS SNI checks, secret substitution); default 80
	// and 443.
	EgressPorts []uint16
	// EgressDir holds the egress proxy's CA (ca.pem, ca-key.pem 0600), the
	// placeholder key and the CA bundle mounted into boxes with secrets
	// (default StateDir/egress).
	EgressDir string
	// EgressRoots are extra PEM files of CAs the proxy trusts, besides the
	// host's, when it re-originates intercepted TLS (tests, private CAs).
	EgressRoots []string
	// Limits bound each box's use of the DNS forwarder and the egress
	// proxy (zero fields: DefaultLimits).
	Limits Limits
	// LockDir holds the lock files that keep two daemons off the same
	// bridge and table (default /run/sbx).
	LockDir string
	// APIPort is the daemon's box API port on the gateway, opened to boxes
	// whose policy has APIAccess (0: none).
	APIPort uint16
	Logger  *slog.Logger
}

func (c *Config) setDefaults() error {
	if c.StateDir == "" || !filepath.IsAbs(c.StateDir) {
		return fmt.Errorf("network state dir %q must be absolute: %w", c.StateDir, errdefs.ErrInvalidArgument)
	}
	if c.Bridge == "" {
		c.Bridge = DefaultBridge
	}
	if len(c.Bridge) > 15 || strings.ContainsAny(c.Bridge, "/ \x00") {
		return fmt.Errorf("bridge name %q: %w", c.Bridge, errdefs.ErrInvalidArgument)
	}
	if c.Subnet == "" {
		c.Subnet = DefaultSubnet
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if len(c.Table) > 64 || strings.ContainsAny(c.Table, "/ \x00") {
		return fmt.Errorf("nftables table name %q: %w", c.Table, errdefs.ErrInvalidArgument)
	}
	for i, u := range c.DNSUpstreams {
		if _, _, err := net.SplitHostPort(u); err != nil {
			c.DNSUpstreams[i] = net.JoinHostPort(u, "53")
		}
	}
	if len(c.EgressPorts) == 0 {
		c.EgressPorts = []uint16{80, 443}
	}
	if c.EgressDir == "" {
		c.EgressDir = filepath.Join(c.StateDir, "egress")
	}
	if err := c.Limits.validate(); err != nil {
		return err
	}
	c.Limits.setDefaults()
	if c.LockDir == "" {
		c.LockDir = DefaultLockDir
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Logger = c.Logger.With("component", "network")
	return nil
}
