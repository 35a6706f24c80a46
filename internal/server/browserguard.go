package server

import (
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
)

// Without a token (the default: loopback only) the daemon admits whoever
// reaches it, and a browser on the same machine reaches it too, on behalf
// of any page it shows. Two kinds of page must not act as that client:
//
//   - a page a sandbox serves by path (/proxy/ID/PORT/) shares the API
//     listener's origin, so its script's fetch of /sbx.v1.SandboxService/...
//     (or of another box's envd by routing headers) is same-origin: no
//     preflight, no CORS, the answer readable;
//   - a page of another site whose name the attacker rebinds to 127.0.0.1
//     (DNS rebinding) is same-origin with the daemon under that name, on
//     either listener, the dashboard's terminal included.
//
// So, when no token is needed (openAccess), every request must name the
// daemon by a Host a rebinding page cannot send (an address literal,
// localhost, the proxy domain or PublicURL's host); and on the API listener
// the API, the E2B API and header-routed sandbox calls refuse any request a
// page sent (an Origin header, or Sec-Fetch-Site other than "none"): the
// CLI and SDKs send neither. The dashboard's listener, which serves no
// sandbox content, takes its own page's calls (Origin = its own origin).
// With a token none of this is needed: a page can neither read the token
// nor make the browser send it (the API takes no cookie).

// hostAllowed reports whether host (a request's Host) is one a rebound
// page cannot send: an IP literal, localhost (browsers resolve it and its
// subdomains to loopback themselves), the proxy domain and its names, or
// PublicURL's host. An empty Host (HTTP/1.0) is no browser's.
func (f *Front) hostAllowed(host string) bool {
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	name = strings.TrimSuffix(strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(name, "["), "]")), ".")
	if name == "" {
		return true
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return true
	}
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return true
	}
	if d := strings.ToLower(f.cfg.ProxyDomain); d != "" && (name == d || strings.HasSuffix(name, "."+d)) {
		return true
	}
	if f.cfg.PublicURL != "" {
		if u, err := url.Parse(f.cfg.PublicURL); err == nil && strings.EqualFold(strings.TrimSuffix(u.Hostname(), "."), name) {
			return true
		}
	}
	return false
}

// fromPage reports whether a browser sent r on behalf of a page (or a
// worker): fetches and form posts carry Origin, and every request of a
// page carries Sec-Fetch-Site ("none" only for what the user typed or
// bookmarked).
func fromPage(r *http.Request) bool {
	if r.Header.Get("Origin") != "" {
		return true
	}
	site := r.Header.Get("Sec-Fetch-Site")
	return site != "" && site != "none"
}

// sameOriginPage reports whether r comes from a page of r's own origin
// (scheme and Host), or from no page at all.
func sameOriginPage(r *http.Request) bool {
	if !fromPage(r) {
		return true
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return false
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true // Sec-Fetch-Site said same-origin
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return strings.EqualFold(origin, scheme+"://"+r.Host)
}

// refuseBrowser writes a 403 naming why; used only without a token.
func refuseBrowser(w http.ResponseWriter, why string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusForbidden)
	_ = json.NewEncoder(w).Encode(map[string]string{"code": "permission_denied", "message": "sbx: " + why +
		" (this daemon needs no token, so it refuses what a web page could send as its user; give it a token with --auth-token-file)"})
}

// guardHost refuses (403) a request without a token whose Host is not
// hostAllowed (DNS rebinding); true: go on.
func (f *Front) guardHost(w http.ResponseWriter, r *http.Request) bool {
	if !f.openAccess() || f.hostAllowed(r.Host) {
		return true
	}
	refuseBrowser(w, "Host "+r.Host+" is not this daemon's name (an address, localhost, --proxy-domain or --public-url's host)")
	return false
}
