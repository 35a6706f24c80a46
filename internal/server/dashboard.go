package server

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// The web dashboard lives on its own listener (the daemon's --ui-listen),
// an origin that never serves anything a sandbox controls. A browser keeps
// the dashboard's token in that origin's sessionStorage and the page calls
// the API there with it; sandbox ports (path, header or host-name routing,
// /tcp/, the E2B envd routes) are served only on the API listener, a
// different origin (another port, or another host under --proxy-domain).
// So a page a sandbox serves can neither read the token nor call the API
// as the user: the same-origin policy keeps it out of the dashboard's
// storage, responses and frames, and the dashboard's API takes no cookie.

// Dashboard returns the handler of the dashboard's listener: the
// dashboard's files (ui) under /ui/, its terminal (ExecWSPath, which
// refuses a WebSocket from any other origin), /healthz and the API with
// Authorization: Bearer as on the API listener. Requests for sandbox ports
// get 404: they belong to the API listener.
func (f *Front) Dashboard(ui http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f.cfg.Observer != nil {
			r = r.WithContext(context.WithValue(r.Context(), observerKey{}, f.cfg.Observer))
		}
		if rt, err := parseRoute(r.Host, r.Header, r.URL.EscapedPath(), f.cfg.ProxyDomain); err != nil || rt.kind != routeAPI {
			http.Error(w, "sbx: sandbox ports are not served on the dashboard's listener (an origin that never serves sandbox content); use the API address", http.StatusNotFound)
			return
		}
		if r.URL.Path != "/healthz" && !f.guardHost(w, r) {
			return
		}
		switch {
		case r.URL.Path == "/healthz":
			f.api.ServeHTTP(w, r)
			return
		case r.URL.Path == ExecWSPath:
			f.serveExecWS(w, r) // authenticates its first message
			return
		case r.URL.Path == "/" && r.Method == http.MethodGet:
			http.Redirect(w, r, "/ui/", http.StatusFound)
			return
		case r.URL.Path == "/ui" || strings.HasPrefix(r.URL.Path, "/ui/"):
			ui.ServeHTTP(w, r)
			return
		}
		if f.openAccess() && !sameOriginPage(r) {
			refuseBrowser(w, "the dashboard's API takes calls from the dashboard's own page only")
			return
		}
		r, ok := f.authAPI(w, r)
		if !ok {
			return
		}
		// Nothing the dashboard calls needs the exec upgrade or MCP, and
		// the E2B API's URLs hand out sandbox addresses: keep them on the
		// API listener.
		if r.URL.Path == ExecPath || r.URL.Path == MCPPath || f.cfg.E2B != nil && f.cfg.E2B.IsAPIPath(r.URL.Path) {
			http.Error(w, "sbx: "+r.URL.Path+" is served on the API address, not the dashboard's", http.StatusNotFound)
			return
		}
		defer f.cfg.Requests.wrap(r)()
		f.api.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), baseURLKey{}, f.publicBase(r))))
	})
}

// redirectToDashboard answers GET / and /ui/... on the API listener with a
// redirect to the dashboard's listener (same host name, its port), or 404
// when the daemon serves no dashboard.
func (f *Front) redirectToDashboard(w http.ResponseWriter, r *http.Request) {
	if f.cfg.DashboardPort == 0 {
		http.Error(w, "sbx: this daemon serves no web dashboard (sbx serve --ui-listen)", http.StatusNotFound)
		return
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, scheme+"://"+host+":"+strconv.Itoa(f.cfg.DashboardPort)+"/ui/", http.StatusFound)
}

// publicBase is the daemon's API URL as r's client sees it.
func (f *Front) publicBase(r *http.Request) string {
	if f.cfg.PublicURL != "" {
		return f.cfg.PublicURL
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}
