package server

import (
	"net/http"
)

// E2BAPI is the E2B-compatible API (internal/e2b) as the front sees it:
// the control plane on its REST paths, and envd and the code interpreter on
// their ports of every sandbox (49983, 49999), served by the daemon instead
// of proxied into the sandbox. The front authenticates first and passes the
// token it accepted; the API acts with it, so tenancy holds.
type E2BAPI interface {
	// IsAPIPath reports whether an API request's path is E2B's.
	IsAPIPath(path string) bool
	// Serves reports whether requests routed to port are E2B's.
	Serves(port uint32) bool
	ServeAPI(w http.ResponseWriter, r *http.Request, token string)
	ServeSandbox(w http.ResponseWriter, r *http.Request, token, sandbox string, port uint32)
	// WriteError writes a refusal in E2B's shape.
	WriteError(w http.ResponseWriter, status int, msg string)
}

// Headers carrying E2B credentials: the API key on the control plane, the
// sandbox's access tokens on envd and the code interpreter (the E2B API
// hands out the sandbox's envd token as both: envdtoken.go; the owner's API
// key is accepted there too).
const (
	HeaderE2BAPIKey        = "X-Api-Key"
	HeaderE2BAccessToken   = "X-Access-Token"
	HeaderE2BTrafficAccess = "E2b-Traffic-Access-Token"
)

// e2bAuth returns who the first accepted token among toks acts as. A
// sandbox's envd token (envdtoken.go) counts only where envd is true.
func (f *Front) e2bAuth(r *http.Request, envd bool, toks ...string) (*http.Request, string, bool) {
	if f.openAccess() {
		return r, "", true
	}
	for _, tok := range toks {
		if p, ok := f.authenticate(r, tok); ok && (envd || p.Only == "") {
			return admitted(r, p, tok), tok, true
		}
	}
	return nil, "", false
}

// serveE2BAPI serves E2B's control plane (X-API-Key, or a bearer token).
func (f *Front) serveE2BAPI(w http.ResponseWriter, r *http.Request) {
	r, tok, ok := f.e2bAuth(r, false, r.Header.Get(HeaderE2BAPIKey), bearer(r))
	if !ok {
		f.cfg.E2B.WriteError(w, http.StatusUnauthorized, "invalid or missing API key: send X-API-Key (E2B_API_KEY) with an sbx token")
		return
	}
	defer f.cfg.Requests.wrap(r)()
	f.cfg.E2B.ServeAPI(w, r, tok)
}

// serveE2BSandbox serves a request to envd or the code interpreter of rt's
// sandbox. Authorization is not a credential here: envd's carries the
// user name (Basic).
func (f *Front) serveE2BSandbox(w http.ResponseWriter, r *http.Request, rt route) {
	toks := []string{r.Header.Get(HeaderE2BAccessToken), r.Header.Get(HeaderE2BTrafficAccess), r.Header.Get(HeaderToken)}
	r2, tok, ok := f.e2bAuth(r, true, toks...)
	if !ok {
		// The envd token of a sandbox that is gone: answer as E2B's proxy
		// does for a sandbox that is not running (the SDKs' isRunning reads
		// 502 as false), not as for a bad credential.
		for _, t := range toks {
			if id, valid := envdSandbox(f.cfg.EnvdKey, t); valid && id == rt.sandbox {
				f.cfg.E2B.WriteError(w, http.StatusBadGateway, "sandbox "+id+" is not running")
				return
			}
		}
		f.cfg.E2B.WriteError(w, http.StatusUnauthorized, "invalid or missing access token: send X-Access-Token (the envdAccessToken the E2B API returned)")
		return
	}
	// envd's and the interpreter's request bodies count against the
	// caller's request-bytes budget like the API's.
	defer f.cfg.Requests.wrap(r2)()
	f.cfg.E2B.ServeSandbox(w, r2, tok, rt.sandbox, rt.port)
}
