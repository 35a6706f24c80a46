package image

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"syscall"
	"time"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// A pull connects wherever the reference, and then the registry, say: the
// registry's host, the hosts its redirects and its token realm name. On
// behalf of a tenant that made the daemon a way into the host's and its
// network's internal services (loopback, the private ranges, cloud
// metadata at 169.254.169.254), whose answers came back in the pull's
// error. PublicOnly checks the address each connection actually goes to,
// after name resolution and for every hop, so no name, redirect or realm
// gets around it.

// nonPublic are ranges no tenant's pull may reach beyond those netip
// classifies (loopback, private, link-local, multicast, unspecified).
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),     // "this network"
	netip.MustParsePrefix("100.64.0.0/10"), // carrier-grade NAT
	netip.MustParsePrefix("192.0.0.0/24"),  // IETF protocol assignments
	netip.MustParsePrefix("240.0.0.0/4"),   // reserved, broadcast
	netip.MustParsePrefix("64:ff9b::/96"),  // NAT64: an IPv4 address in disguise
	netip.MustParsePrefix("64:ff9b:1::/48"),
}

// PublicOnly returns a PullAddrs policy admitting public addresses that are
// not the host's own, and those in allow (the operator's registries on
// private addresses).
func PublicOnly(allow []netip.Prefix) func(netip.Addr) error {
	return func(a netip.Addr) error {
		a = a.Unmap()
		for _, p := range allow {
			if p.Contains(a) {
				return nil
			}
		}
		if !publicAddr(a) || hostAddr(a) {
			return fmt.Errorf("%s is not a public address (pulls of tenants reach only public registries, and those the daemon's --tenant-pull-allow lists): %w",
				a, errdefs.ErrPermissionDenied)
		}
		return nil
	}
}

func publicAddr(a netip.Addr) bool {
	if !a.IsValid() || a.IsUnspecified() || a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() ||
		a.IsLinkLocalMulticast() || a.IsInterfaceLocalMulticast() || a.IsMulticast() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// hostAddr reports whether a is one of this host's addresses (a service
// listening on the host's public address is the host's all the same).
func hostAddr(a netip.Addr) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return true // cannot tell: refuse
	}
	for _, ia := range addrs {
		if n, ok := ia.(*net.IPNet); ok {
			if h, ok := netip.AddrFromSlice(n.IP); ok && h.Unmap() == a {
				return true
			}
		}
	}
	return false
}

// pullTransport is the HTTP transport of pulls: check, when set, is asked
// about every address a connection is about to be made to. With a proxy
// from the environment the connection goes to the proxy, which resolves
// names itself: then a request to an address literal is still checked.
func pullTransport(check func(netip.Addr) error) http.RoundTripper {
	t := http.DefaultTransport.(*http.Transport).Clone()
	if check == nil {
		return t
	}
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("pull: connecting to %s: %w", address, err)
			}
			return check(ap.Addr())
		}}
	t.DialContext = d.DialContext
	proxy := t.Proxy
	t.Proxy = func(r *http.Request) (*url.URL, error) {
		if a, err := netip.ParseAddr(r.URL.Hostname()); err == nil {
			if err := check(a); err != nil {
				return nil, err
			}
		} else if r.URL.Hostname() == "localhost" {
			return nil, check(netip.IPv6Loopback())
		}
		if proxy == nil {
			return nil, nil
		}
		return proxy(r)
	}
	return t
}

// dialRefusal finds a PullAddrs refusal in a pull's error, so the caller
// gets it (PermissionDenied naming the address) rather than Unavailable.
func dialRefusal(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) && errors.Is(oe.Err, errdefs.ErrPermissionDenied) {
		return oe.Err
	}
	if errors.Is(err, errdefs.ErrPermissionDenied) {
		return err
	}
	return nil
}
