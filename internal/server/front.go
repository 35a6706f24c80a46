package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
	"github.com/sbxdev/sbx/internal/connlimit"
	"github.com/sbxdev/sbx/internal/sandbox"
	"github.com/sbxdev/sbx/internal/tenant"
)

// FrontConfig configures the daemon's HTTP front.
type FrontConfig struct {
	// Token, when set, is required on every API and proxied request
	// (single-user mode).
	Token string
	// Tenants, when set, replaces Token: each request must carry one of a
	// tenant's tokens and acts as that tenant (tenant.Principal).
	Tenants *tenant.Registry
	// BoxEndpoint makes this the front on the network gateway that boxes
	// reach: it accepts only scoped tokens, each only from its own box.
	BoxEndpoint bool
	// ScopedTokens accepts sandboxes' scoped tokens on a front that is not
	// the box endpoint, from any address. The daemon never sets it (a
	// scoped token that leaks out of its box is useless anywhere else);
	// tests do, to drive scoped calls through a front without networking.
	ScopedTokens bool
	// ProxyDomain turns on routing by host name: <port>-<sandbox-id>.<domain>.
	ProxyDomain string
	// PublicURL is the daemon's address as clients see it (e.g.
	// "https://sbx.example.com"), used in the URLs GetPort returns; ""
	// means the scheme and Host of each request.
	PublicURL string
	// MaxConnsPerSandbox bounds what one sandbox has open through the
	// port proxy at once: HTTP requests in flight (WebSockets included)
	// and raw TCP pipes, however they were routed (path, host name,
	// headers). Each is a client connection the daemon holds for as long
	// as the sandbox's code keeps it open. 0: DefaultMaxConnsPerSandbox.
	MaxConnsPerSandbox int
	// MCP, when set, serves MCPPath (after the same auth as the API): the
	// daemon's streamable-HTTP MCP endpoint (internal/mcp).
	MCP http.Handler
	// Streams counts the exec upgrade's commands against their sandboxes'
	// limits; share the API server's (nil: a Streams of the front's own,
	// with the default limits).
	Streams *Streams
	// E2B, when set, serves the E2B-compatible API (e2b.go).
	E2B E2BAPI
	// Requests bounds the bytes of API requests being read, per tenant and
	// in all (requestbudget.go); nil: NewRequestBudget(0, 0). Share one
	// between the fronts of a daemon.
	Requests *RequestBudget
	// EnvdKey, when set, makes sandboxes' E2B envd tokens (EnvdToken)
	// credentials: each acts on its own sandbox alone (envdtoken.go).
	EnvdKey []byte
	// DashboardPort is the port of the dashboard's own listener (Dashboard);
	// GET / and /ui/ on this front redirect there (0: no dashboard, 404).
	// The dashboard is never served here: this front serves sandbox ports,
	// and a page a sandbox serves must not share the dashboard's origin.
	DashboardPort int
	// Observer, if set, is in every request's context (observe.go).
	Observer *Observer
	Logger   *slog.Logger
}

// maxTokenCookies bounds the sbx_token cookies of one request tried.
const maxTokenCookies = 8

// MCPPath is where FrontConfig.MCP is served.
const MCPPath = "/mcp"

// DefaultMaxConnsPerSandbox is FrontConfig.MaxConnsPerSandbox's default.
const DefaultMaxConnsPerSandbox = 1024

// Front is the handler on the daemon's listener: it authenticates every
// request, serves the API, and proxies requests routed to sandbox ports (by
// path, host name or headers) through the manager's agent connections.
type Front struct {
	cfg   FrontConfig
	mgr   *sandbox.Manager
	api   http.Handler
	log   *slog.Logger
	token []byte // sha256 of cfg.Token; nil: no auth
	proxy *httputil.ReverseProxy
	tr    *http.Transport
	// conns counts proxied connections by sandbox id.
	conns *connlimit.Counter[string]
	// streams counts the exec upgrade's commands.
	streams *Streams
	// done ends with Close: it closes the upgraded exec connections, which
	// the HTTP server no longer tracks.
	done context.Context
	stop context.CancelFunc
}

// NewFront wraps api (the Connect handlers) with auth, the port proxy and
// the PortService.
func NewFront(api http.Handler, mgr *sandbox.Manager, cfg FrontConfig) *Front {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	cfg.PublicURL = strings.TrimSuffix(cfg.PublicURL, "/")
	cfg.ProxyDomain = strings.Trim(cfg.ProxyDomain, ".")
	if cfg.Requests == nil {
		cfg.Requests = NewRequestBudget(0, 0)
	}
	if cfg.MaxConnsPerSandbox <= 0 {
		cfg.MaxConnsPerSandbox = DefaultMaxConnsPerSandbox
	}
	f := &Front{cfg: cfg, mgr: mgr, log: log,
		conns: connlimit.NewCounter[string](cfg.MaxConnsPerSandbox, log, "port proxy connections per sandbox")}
	f.streams = cfg.Streams
	if f.streams == nil {
		f.streams = NewStreams(mgr, StreamLimits{}, log)
	}
	f.done, f.stop = context.WithCancel(context.Background())
	if cfg.Token != "" && cfg.Tenants == nil {
		f.token = f.hash(cfg.Token)
	}
	mux := http.NewServeMux()
	serveService(mux, func(o ...connect.HandlerOption) (string, http.Handler) {
		return sbxv1connect.NewPortServiceHandler(&PortServer{mgr: mgr, domain: cfg.ProxyDomain, public: cfg.PublicURL}, o...)
	})
	mux.Handle("/", uncompressedData(api))
	f.api = mux
	f.initProxy()
	return f
}

// Close drops idle proxied connections and ends the exec upgrades (their
// running commands are cancelled).
func (f *Front) Close() {
	f.stop()
	f.tr.CloseIdleConnections()
}

type baseURLKey struct{}

// baseURL is the daemon's URL as the client of ctx's request sees it.
func baseURL(ctx context.Context) string {
	s, _ := ctx.Value(baseURLKey{}).(string)
	return s
}

func (f *Front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.cfg.Observer != nil {
		r = r.WithContext(context.WithValue(r.Context(), observerKey{}, f.cfg.Observer))
	}
	if r.URL.Path != "/healthz" && !f.guardHost(w, r) {
		return
	}
	rt, err := parseRoute(r.Host, r.Header, r.URL.EscapedPath(), f.cfg.ProxyDomain)
	if err != nil {
		// Say nothing about sandboxes to strangers.
		if _, ok := f.authProxy(w, r, "/"); !ok {
			return
		}
		http.Error(w, "sbx: "+err.Error(), http.StatusBadRequest)
		return
	}
	switch rt.kind {
	case routeAPI:
		if r.URL.Path == "/healthz" {
			f.api.ServeHTTP(w, r)
			return
		}
		if r.Method == http.MethodGet && (r.URL.Path == "/" || r.URL.Path == "/ui" || strings.HasPrefix(r.URL.Path, "/ui/")) {
			f.redirectToDashboard(w, r)
			return
		}
		if f.openAccess() && fromPage(r) {
			refuseBrowser(w, "the API on this listener takes no call from a web page (sandboxes' pages share its origin; the dashboard has a listener of its own)")
			return
		}
		if f.cfg.E2B != nil && f.cfg.E2B.IsAPIPath(r.URL.Path) {
			f.serveE2BAPI(w, r)
			return
		}
		r, ok := f.authAPI(w, r)
		if !ok {
			return
		}
		if r.URL.Path == ExecPath {
			f.serveExec(w, r)
			return
		}
		if r.URL.Path == FilesPath {
			f.serveFiles(w, r)
			return
		}
		if r.URL.Path == MCPPath && f.cfg.MCP != nil {
			f.cfg.MCP.ServeHTTP(w, r)
			return
		}
		defer f.cfg.Requests.wrap(r)()
		f.api.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), baseURLKey{}, f.publicBase(r))))
	case routeHTTP:
		if rt.by == "header" && f.openAccess() && fromPage(r) {
			refuseBrowser(w, "a sandbox routed by headers takes no call from a web page (only the SDKs route by headers)")
			return
		}
		if f.cfg.E2B != nil && rt.by != "path" && f.cfg.E2B.Serves(rt.port) {
			f.serveE2BSandbox(w, r, rt)
			return
		}
		r, ok := f.authProxy(w, r, rt.cookiePath())
		if !ok {
			return
		}
		f.serveProxy(w, r, rt)
	case routeTCP:
		r, ok := f.authProxy(w, r, rt.cookiePath())
		if !ok {
			return
		}
		f.serveTCP(w, r, rt)
	}
}

func (f *Front) hash(tok string) []byte {
	sum := sha256.Sum256([]byte(tok))
	return sum[:]
}

// validToken compares a presented token with the daemon's in constant time.
func (f *Front) validToken(tok string) bool {
	if tok == "" || f.token == nil {
		return false
	}
	sum := sha256.Sum256([]byte(tok))
	return subtle.ConstantTimeCompare(sum[:], f.token) == 1
}

// openAccess reports whether requests need no token at all: single-user
// mode without a token, never on the box endpoint.
func (f *Front) openAccess() bool {
	return f.token == nil && f.cfg.Tenants == nil && !f.cfg.BoxEndpoint
}

type presentedKey struct{}

// authenticate returns who tok acts as. On the box endpoint only a scoped
// token from its own box's address counts; elsewhere the daemon's token
// (single-user) or a tenant's token.
func (f *Front) authenticate(r *http.Request, tok string) (tenant.Principal, bool) {
	if tok == "" {
		return tenant.Principal{}, false
	}
	if !f.cfg.BoxEndpoint {
		if f.cfg.Tenants != nil {
			if p, ok := f.cfg.Tenants.Current().Authenticate(tok); ok {
				return p, true
			}
		} else if f.validToken(tok) {
			return tenant.Principal{}, true
		}
		if p, ok := f.envdPrincipal(tok); ok {
			return p, true
		}
	}
	if f.mgr == nil || !f.cfg.BoxEndpoint && !f.cfg.ScopedTokens {
		return tenant.Principal{}, false
	}
	p, ip, ok := f.mgr.ScopedPrincipal(tok)
	if !ok {
		return tenant.Principal{}, false
	}
	if f.cfg.BoxEndpoint {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil || !ip.IsValid() || host != ip.String() {
			return tenant.Principal{}, false
		}
	}
	if p.Tenant != "" {
		// The tenant's quotas as they are now; a tenant removed from the
		// file (and reloaded) takes its boxes' tokens' power with it.
		if f.cfg.Tenants == nil {
			return tenant.Principal{}, false
		}
		q, ok := f.cfg.Tenants.Current().Quotas(p.Tenant)
		if !ok {
			return tenant.Principal{}, false
		}
		p.Quotas = q
	}
	return p, true
}

// admitted returns r carrying its Principal and the token it presented
// (stripCredentials removes that one from what a sandbox gets).
func admitted(r *http.Request, p tenant.Principal, tok string) *http.Request {
	ctx := tenant.WithPrincipal(r.Context(), p)
	return r.WithContext(context.WithValue(ctx, presentedKey{}, tok))
}

// bearer returns the token of an "Authorization: Bearer T" header.
func bearer(r *http.Request) string {
	v := r.Header.Get("Authorization")
	if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
		return strings.TrimSpace(v[7:])
	}
	return ""
}

// authAPI checks an API request (Authorization: Bearer only: cookies would
// let pages the proxy serves call the API).
func (f *Front) authAPI(w http.ResponseWriter, r *http.Request) (*http.Request, bool) {
	if f.openAccess() {
		return r, true
	}
	tok := bearer(r)
	if p, ok := f.authenticate(r, tok); ok {
		if p.Only != "" && !envdPathAllowed(r.URL.Path) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			_ = json.NewEncoder(w).Encode(map[string]string{"code": "permission_denied",
				"message": "a sandbox's E2B envd token reaches that sandbox's envd and code interpreter only, not " + r.URL.Path})
			return nil, false
		}
		return admitted(r, p, tok), true
	}
	msg := "missing API token: send Authorization: Bearer <token> (SBX_TOKEN for the CLI and SDKs)"
	if tok != "" {
		msg = "invalid API token"
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("WWW-Authenticate", `Bearer realm="sbx"`)
	w.WriteHeader(http.StatusUnauthorized)
	_ = json.NewEncoder(w).Encode(map[string]string{"code": "unauthenticated", "message": msg})
	return nil, false
}

// authProxy checks a proxied request: the token may come as a bearer token,
// in X-Sbx-Token, in the sbx_token cookie or, once, in the sbx_token query
// parameter (a GET then gets the cookie, scoped to cookiePath, and a
// redirect without it).
func (f *Front) authProxy(w http.ResponseWriter, r *http.Request, cookiePath string) (*http.Request, bool) {
	if f.openAccess() {
		return r, true
	}
	// The admin token reaches no sandbox, and an E2B envd token only its
	// sandbox's envd: neither is a proxy credential.
	auth := func(tok string) (tenant.Principal, bool) {
		p, ok := f.authenticate(r, tok)
		return p, ok && !p.Admin && p.Only == ""
	}
	for _, tok := range []string{bearer(r), r.Header.Get(HeaderToken)} {
		if p, ok := auth(tok); ok {
			return admitted(r, p, tok), true
		}
	}
	// Every sbx_token cookie, not the first only: under path routing a
	// sandbox's page shares the origin and can set one (document.cookie)
	// for another sandbox's longer path, which the browser sends first; if
	// only the first counted, that page would lock the user out of the
	// other sandbox. A few at most: each costs a hash.
	for i, c := range r.CookiesNamed(TokenCookie) {
		if i == maxTokenCookies {
			break
		}
		if p, ok := auth(c.Value); ok {
			return admitted(r, p, c.Value), true
		}
	}
	if q := r.URL.Query().Get(TokenQueryParam); q != "" {
		if p, ok := auth(q); ok {
			if (r.Method == http.MethodGet || r.Method == http.MethodHead) && !isUpgrade(r) {
				http.SetCookie(w, &http.Cookie{
					Name: TokenCookie, Value: q, Path: cookiePath, HttpOnly: true, Secure: r.TLS != nil,
					SameSite: http.SameSiteLaxMode, MaxAge: int((7 * 24 * time.Hour).Seconds()),
				})
				u := *r.URL
				qs := u.Query()
				qs.Del(TokenQueryParam)
				u.RawQuery = qs.Encode()
				u.Scheme, u.Host = "", ""
				w.Header().Set("Cache-Control", "no-store")
				http.Redirect(w, r, u.RequestURI(), http.StatusFound)
				return nil, false
			}
			return admitted(r, p, q), true
		}
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="sbx"`)
	http.Error(w, "sbx: this port needs the daemon's token: Authorization: Bearer <token>, X-Sbx-Token, or ?sbx_token=<token> once in a browser", http.StatusUnauthorized)
	return nil, false
}

// stripCredentials removes everything of the daemon's from a request bound
// for a sandbox: its token (wherever it came) and its routing headers. The
// token must never reach sandbox code: besides the places it is accepted
// from (Authorization: Bearer, X-Sbx-Token, the sbx_token cookie and query
// parameter) it is taken out of the Referer's query (a browser sends the
// URL of the page it came from, which may still carry ?sbx_token=) and,
// as a backstop, any header, trailer, cookie or query parameter whose value
// still holds it (plain, URL-escaped or in Basic credentials) is dropped.
func (f *Front) stripCredentials(out *http.Request) {
	h := out.Header
	secret := presented(out)
	if tok := bearer(out); tok != "" && tok == secret {
		h.Del("Authorization")
	}
	if q := out.URL.Query(); q.Has(TokenQueryParam) {
		q.Del(TokenQueryParam)
		out.URL.RawQuery = q.Encode()
	}
	for _, k := range []string{HeaderToken, HeaderSandbox, HeaderPort, HeaderE2BSandboxID, HeaderE2BSandboxPort} {
		h.Del(k)
	}
	if refs := h.Values("Referer"); len(refs) > 0 {
		h.Del("Referer")
		for _, ref := range refs {
			if clean, ok := stripTokenParam(ref); ok {
				h.Add("Referer", clean)
			}
		}
	}
	if cookies := h.Values("Cookie"); len(cookies) > 0 {
		var keep []string
		for _, line := range cookies {
			for _, part := range strings.Split(line, ";") {
				part = strings.TrimSpace(part)
				name, _, _ := strings.Cut(part, "=")
				if name != TokenCookie && part != "" && !holdsToken(part, secret) {
					keep = append(keep, part)
				}
			}
		}
		h.Del("Cookie")
		if len(keep) > 0 {
			h.Set("Cookie", strings.Join(keep, "; "))
		}
	}
	if secret == "" {
		return
	}
	holds := func(s string) bool { return holdsToken(s, secret) }
	dropTokenValues(h, holds)
	dropTokenValues(out.Trailer, holds)
	if q := out.URL.Query(); holds(out.URL.RawQuery) {
		for k, vs := range q {
			if holds(k) || slices.ContainsFunc(vs, holds) {
				q.Del(k)
			}
		}
		out.URL.RawQuery = q.Encode()
	}
}

// presented returns the token r was admitted with ("" without auth).
func presented(r *http.Request) string {
	s, _ := r.Context().Value(presentedKey{}).(string)
	return s
}

// stripTokenParam removes the sbx_token query parameter from a URL (a
// Referer); ok is false if the URL cannot be parsed (then it is dropped).
func stripTokenParam(raw string) (string, bool) {
	if !strings.Contains(raw, TokenQueryParam) && !strings.Contains(raw, "%") {
		return raw, true
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", false
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return "", false
	}
	if !q.Has(TokenQueryParam) {
		return raw, true
	}
	q.Del(TokenQueryParam)
	u.RawQuery = q.Encode()
	return u.String(), true
}

// dropTokenValues removes every value of h that holds the request's token
// (and a header whose name holds it).
func dropTokenValues(h http.Header, holds func(string) bool) {
	for k, vs := range h {
		if holds(k) {
			delete(h, k)
			continue
		}
		if !slices.ContainsFunc(vs, holds) {
			continue
		}
		vs = slices.DeleteFunc(slices.Clone(vs), holds)
		if len(vs) == 0 {
			delete(h, k)
		} else {
			h[k] = vs
		}
	}
}

// holdsToken reports whether s contains tok: as is, URL-escaped, or as
// the user or password of Basic credentials.
func holdsToken(s, tok string) bool {
	if tok == "" {
		return false
	}
	if strings.Contains(s, tok) {
		return true
	}
	if strings.Contains(s, "%") || strings.Contains(s, "+") {
		if u, err := url.QueryUnescape(s); err == nil && strings.Contains(u, tok) {
			return true
		}
		if u, err := url.PathUnescape(s); err == nil && strings.Contains(u, tok) {
			return true
		}
	}
	if len(s) > 6 && strings.EqualFold(s[:6], "basic ") {
		if b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s[6:])); err == nil && strings.Contains(string(b), tok) {
			return true
		}
	}
	return false
}

func isUpgrade(r *http.Request) bool {
	return r.Header.Get("Upgrade") != "" && headerHasToken(r.Header, "Connection", "upgrade")
}

func headerHasToken(h http.Header, key, tok string) bool {
	for _, v := range h.Values(key) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), tok) {
				return true
			}
		}
	}
	return false
}

// CheckListen refuses an address reachable from other machines without a
// token unless insecure is set.
func CheckListen(addr, token string, insecure bool) error {
	if token != "" || insecure {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("listen address %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return errors.New("refusing to listen on " + addr + " without an API token: anyone who can reach it could run code on this machine. " +
		"Give one with --auth-token-file FILE or SBX_AUTH_TOKEN, listen on 127.0.0.1, or pass --insecure-no-auth")
}
