package server

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Routing headers. E2B's SDKs send E2b-Sandbox-Id and E2b-Sandbox-Port to
// every sandbox request (e2b-dev/E2B packages/js-sdk/src/sandbox/index.ts,
// `sandboxHeaders`), and E2B's proxy routes by them before falling back to
// the `<port>-<sandbox-id>.<domain>` host name (e2b-dev/infra
// packages/shared/pkg/proxy/host.go: headerSandboxID = "E2b-Sandbox-Id",
// headerSandboxPort = "E2b-Sandbox-Port"; headers win when present). sbx
// accepts those and its own pair.
const (
	HeaderE2BSandboxID   = "E2b-Sandbox-Id"
	HeaderE2BSandboxPort = "E2b-Sandbox-Port"
	HeaderSandbox        = "X-Sbx-Sandbox"
	HeaderPort           = "X-Sbx-Port"
	// HeaderToken carries the daemon's token when Authorization belongs to
	// the sandbox's application.
	HeaderToken = "X-Sbx-Token"
)

// Browser credentials for proxied ports: a one-time query parameter that
// the proxy turns into a cookie.
const (
	TokenQueryParam = "sbx_token"
	TokenCookie     = "sbx_token"
)

// routeKind says what a request is for.
type routeKind int

const (
	routeAPI  routeKind = iota // the RPC API (and /healthz)
	routeHTTP                  // HTTP/WebSocket to a sandbox port
	routeTCP                   // raw TCP through an Upgrade
)

// route is where a request goes.
type route struct {
	kind    routeKind
	sandbox string // id or name as given
	port    uint32
	// by says how it was routed: "path", "host" or "header".
	by string
	// prefix is the path prefix stripped by path routing ("/proxy/ID/PORT").
	prefix string
	// rest is the escaped path forwarded to the sandbox (path routing);
	// "" when the request named no path after the port (redirect to "/").
	rest string
}

// errBadRoute is a malformed routing request (400).
var errBadRoute = errors.New("bad sandbox route")

// parseRoute decides where a request goes. Headers win over the host name,
// the host name over the path. domain is the proxy domain ("" = host
// routing off). escapedPath is the request's escaped path.
func parseRoute(host string, h http.Header, escapedPath, domain string) (route, error) {
	for _, pair := range [][2]string{{HeaderE2BSandboxID, HeaderE2BSandboxPort}, {HeaderSandbox, HeaderPort}} {
		id, port := h.Get(pair[0]), h.Get(pair[1])
		if id == "" && port == "" {
			continue
		}
		if id == "" || port == "" {
			return route{}, fmt.Errorf("%w: headers %s and %s go together", errBadRoute, pair[0], pair[1])
		}
		p, err := parsePort(port)
		if err != nil {
			return route{}, err
		}
		return route{kind: routeHTTP, sandbox: id, port: p, by: "header"}, nil
	}
	if domain != "" {
		if r, ok, err := parseHostRoute(host, domain); ok || err != nil {
			return r, err
		}
	}
	if rest, ok := strings.CutPrefix(escapedPath, "/proxy/"); ok {
		seg := strings.SplitN(rest, "/", 3)
		if len(seg) < 2 || seg[0] == "" {
			return route{}, fmt.Errorf("%w: want /proxy/SANDBOX/PORT/PATH", errBadRoute)
		}
		sb, p, err := parseSandboxPort(seg[0], seg[1])
		if err != nil {
			return route{}, err
		}
		r := route{kind: routeHTTP, sandbox: sb, port: p, by: "path", prefix: "/proxy/" + seg[0] + "/" + seg[1]}
		if len(seg) == 3 {
			r.rest = "/" + seg[2]
		}
		return r, nil
	}
	if rest, ok := strings.CutPrefix(escapedPath, "/tcp/"); ok {
		seg := strings.Split(rest, "/")
		if len(seg) != 2 || seg[0] == "" {
			return route{}, fmt.Errorf("%w: want /tcp/SANDBOX/PORT", errBadRoute)
		}
		sb, p, err := parseSandboxPort(seg[0], seg[1])
		if err != nil {
			return route{}, err
		}
		return route{kind: routeTCP, sandbox: sb, port: p, by: "path"}, nil
	}
	return route{kind: routeAPI}, nil
}

// parseHostRoute matches "<port>-<sandbox-id>.<domain>[:port]". Sandbox
// ids contain hyphens, so only the first one separates the port. ok is
// false for hosts outside the domain (and the domain itself: the API).
func parseHostRoute(host, domain string) (r route, ok bool, err error) {
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	domain = strings.ToLower(strings.Trim(domain, "."))
	label, ok := strings.CutSuffix(name, "."+domain)
	if !ok {
		return route{}, false, nil
	}
	portStr, id, found := strings.Cut(label, "-")
	if !found || id == "" || strings.Contains(label, ".") {
		return route{}, true, fmt.Errorf("%w: host %q: want <port>-<sandbox-id>.%s", errBadRoute, host, domain)
	}
	p, err := parsePort(portStr)
	if err != nil {
		return route{}, true, err
	}
	return route{kind: routeHTTP, sandbox: id, port: p, by: "host"}, true, nil
}

// parseSandboxPort parses a path's escaped sandbox and port segments.
func parseSandboxPort(sandbox, port string) (string, uint32, error) {
	sb, err := url.PathUnescape(sandbox)
	if err != nil {
		return "", 0, fmt.Errorf("%w: sandbox %q: %v", errBadRoute, sandbox, err)
	}
	p, err := parsePort(port)
	return sb, p, err
}

func parsePort(s string) (uint32, error) {
	p, err := strconv.ParseUint(s, 10, 32)
	if err != nil || p == 0 || p > 65535 {
		return 0, fmt.Errorf("%w: port %q is not a number in 1-65535", errBadRoute, s)
	}
	return uint32(p), nil
}

// cookiePath is the Path of the token cookie a browser gets for rt. Under
// path routing every sandbox's pages share the daemon's origin, so the
// cookie covers only this sandbox port's prefix: a page of sandbox A that
// fetches /proxy/B/... does not carry the user's credential (from A's
// visit) to B. Host names are origins of their own: "/".
func (rt route) cookiePath() string {
	if rt.by == "path" && rt.prefix != "" {
		return rt.prefix + "/"
	}
	return "/"
}
