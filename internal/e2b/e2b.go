// Package e2b serves an E2B-compatible API so that code written against
// E2B's own SDKs (the `e2b` and `@e2b/code-interpreter` npm packages, the
// `e2b` Python package) runs on sbx by changing E2B_API_URL and
// E2B_SANDBOX_URL (or E2B_DOMAIN):
//
//   - the control plane (REST: /v2/sandboxes, /sandboxes/{id}/...), see
//     control.go;
//   - envd, the in-sandbox daemon E2B's SDKs reach on port 49983: the
//     Connect services filesystem.Filesystem and process.Process and the
//     HTTP /files endpoint, see envd_fs.go and envd_proc.go;
//   - the code interpreter on port 49999 (/execute NDJSON, /contexts), see
//     interp.go.
//
// Nothing runs inside the sandbox for this: every call is translated into
// calls of sbx's own Connect API, made back to the daemon's own listener
// with the caller's token (as internal/mcp does), so auth, tenancy and
// limits apply exactly as to any sbx client — a tenant's API key sees only
// its tenant's sandboxes. The front (internal/server) authenticates the
// request first and hands over the token it accepted. The package imports
// the generated APIs only; nothing of the daemon.
package e2b

import (
	"crypto/sha256"
	"crypto/tls"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
)

// Ports E2B's SDKs send in E2b-Sandbox-Port for envd and the code
// interpreter. With the E2B API on, requests routed to these ports of a
// sandbox are served here, not proxied into the sandbox.
const (
	EnvdPort        = 49983
	InterpreterPort = 49999
)

// EnvdVersion is the envd version the API reports. The SDKs gate features
// on it: 0.5.7 means octet-stream uploads, CloseStdin and per-user
// requests; file metadata (0.6.2) is not offered.
const EnvdVersion = "0.5.7"

// Config configures Handler.
type Config struct {
	// BaseURL is where the daemon's own API is reached (its listener, over
	// loopback when it listens on all addresses).
	BaseURL string
	// TLS is the client configuration for an https BaseURL.
	TLS *tls.Config
	// DefaultImage is the sbx image for E2B's stock templates ("base",
	// "code-interpreter-v1", ...) and a create without one; "" is the
	// daemon's default image. Any other template id is taken as an sbx
	// image reference.
	DefaultImage string
	// EnvdToken returns a sandbox's envd access token, handed to E2B's SDKs
	// as envdAccessToken and trafficAccessToken: a secret of that sandbox
	// alone, never the caller's API key (the daemon's front checks it and
	// lets it act on that sandbox's envd and code interpreter only). Nil:
	// the API returns no access tokens.
	EnvdToken func(sandboxID string) string
	// MaxUploadBytes bounds one POST /files body (0: DefaultMaxUploadBytes).
	MaxUploadBytes int64
	Logger         *slog.Logger
}

// DefaultMaxUploadBytes is Config.MaxUploadBytes's default.
const DefaultMaxUploadBytes = 1 << 30

// maxBodyBytes bounds the JSON bodies of the control plane and the code
// interpreter (code included).
const maxBodyBytes = 4 << 20

// maxClients bounds the API clients Handler keeps, one per token.
const maxClients = 64

// Handler serves the E2B API. Mount it behind the daemon's auth: it trusts
// the token it is given to be the one the front accepted.
type Handler struct {
	cfg Config
	log *slog.Logger
	tr  *http.Transport

	mu      sync.Mutex
	clients map[[sha256.Size]byte]*clients

	envd     http.Handler // the Connect services and /files
	defaults defaultContexts
	watches  watchCounter
}

// clients are the daemon API clients of one token.
type clients struct {
	token     string
	sandboxes sbxv1connect.SandboxServiceClient
	code      sbxv1connect.CodeServiceClient
	observe   sbxv1connect.ObserveServiceClient
	processes sbxv1connect.ProcessServiceClient
}

// New returns a Handler.
func New(cfg Config) *Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxUploadBytes <= 0 {
		cfg.MaxUploadBytes = DefaultMaxUploadBytes
	}
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetHTTP2(true)
	h := &Handler{cfg: cfg, log: cfg.Logger, clients: map[[sha256.Size]byte]*clients{},
		tr: &http.Transport{Protocols: &protos, TLSClientConfig: cfg.TLS, MaxIdleConnsPerHost: 16, IdleConnTimeout: time.Minute}}
	h.envd = h.envdMux()
	return h
}

// clientsFor returns the API clients that carry token.
func (h *Handler) clientsFor(token string) *clients {
	key := sha256.Sum256([]byte(token))
	h.mu.Lock()
	defer h.mu.Unlock()
	if c, ok := h.clients[key]; ok {
		return c
	}
	if len(h.clients) >= maxClients {
		clear(h.clients)
	}
	hc := &http.Client{Transport: &bearerTransport{base: h.tr, token: token}}
	c := &clients{token: token,
		sandboxes: sbxv1connect.NewSandboxServiceClient(hc, h.cfg.BaseURL),
		code:      sbxv1connect.NewCodeServiceClient(hc, h.cfg.BaseURL),
		observe:   sbxv1connect.NewObserveServiceClient(hc, h.cfg.BaseURL),
		processes: sbxv1connect.NewProcessServiceClient(hc, h.cfg.BaseURL),
	}
	h.clients[key] = c
	return c
}

// Close drops idle connections to the daemon.
func (h *Handler) Close() { h.tr.CloseIdleConnections() }

// bearerTransport adds "Authorization: Bearer token" (none for "").
type bearerTransport struct {
	base  http.RoundTripper
	token string
}

func (t *bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if t.token != "" {
		r.Header.Set("Authorization", "Bearer "+t.token)
	}
	return t.base.RoundTrip(r)
}

// ServeSandbox serves a request E2B's SDK sent to port of sandbox (envd or
// the code interpreter), as the holder of token.
func (h *Handler) ServeSandbox(w http.ResponseWriter, r *http.Request, token, sandbox string, port uint32) {
	r = r.WithContext(withCall(r.Context(), call{c: h.clientsFor(token), sandbox: sandbox}))
	switch port {
	case EnvdPort:
		h.envd.ServeHTTP(w, r)
	case InterpreterPort:
		h.serveInterpreter(w, r)
	default:
		writeError(w, http.StatusBadGateway, "port "+itoa(int64(port))+" is not an E2B service port")
	}
}

// Serves reports whether the E2B API serves port itself.
func (h *Handler) Serves(port uint32) bool { return port == EnvdPort || port == InterpreterPort }
