// Package mcp serves sbx to Model Context Protocol clients (agents): tools
// to create, list and destroy sandboxes, run commands and code (figures
// come back as MCP image content), read, write and list files and expose
// ports. `sbx mcp` serves it on stdio (internal/cli); the daemon serves it
// over streamable HTTP at /mcp (internal/daemon mounts Handler behind the
// front's auth).
//
// The tools are clients of the daemon's own Connect API and carry the
// caller's token, so every rule of auth and tenancy applies to them as to
// any SDK: a tenant's token sees only its tenant's sandboxes. Inputs and
// outputs are bounded by Limits. It imports the generated API and the MCP
// SDK only; nothing of the daemon.
package mcp

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// Version is the server's version as it tells clients.
var Version = "dev"

const instructions = "sbx runs untrusted code in isolated Linux sandboxes. Create a sandbox with create_sandbox, " +
	"then run shell commands with exec or programs with run_code (python figures come back as images), " +
	"move files with write_file/read_file/list_files, and destroy_sandbox when done."

// NewServer returns an MCP server whose tools call b. created, if not nil,
// is told the id of every sandbox the tools create.
func NewServer(b *Backend, lim Limits, created func(id string)) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "sbx", Version: Version}, &mcp.ServerOptions{Instructions: instructions})
	(&tools{b: b, lim: lim, created: created}).register(s)
	return s
}

// Session is one stdio MCP session: it remembers the sandboxes its tools
// created so that Cleanup can destroy them when the client goes away.
type Session struct {
	b   *Backend
	lim Limits

	mu      sync.Mutex
	created map[string]bool // ids of the sandboxes this session created
}

// NewSession returns a session over b.
func NewSession(b *Backend, lim Limits) *Session {
	return &Session{b: b, lim: lim, created: map[string]bool{}}
}

// Run serves the session on t until the client disconnects or ctx ends.
func (s *Session) Run(ctx context.Context, t mcp.Transport) error {
	srv := NewServer(s.b, s.lim, func(id string) {
		s.mu.Lock()
		s.created[id] = true
		s.mu.Unlock()
	})
	return srv.Run(ctx, t)
}

// Cleanup destroys every sandbox the session created that still exists
// and returns the ids it destroyed.
func (s *Session) Cleanup(ctx context.Context) ([]string, error) {
	s.mu.Lock()
	ids := make([]string, 0, len(s.created))
	for id := range s.created {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	var done []string
	var firstErr error
	for _, id := range ids {
		_, err := s.b.sandboxes.DestroySandbox(ctx, connect.NewRequest(&sbxv1.DestroySandboxRequest{Sandbox: id}))
		switch {
		case err == nil:
			done = append(done, id)
		case connect.CodeOf(err) == connect.CodeNotFound:
		default:
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	return done, firstErr
}

// HTTPConfig configures Handler.
type HTTPConfig struct {
	// BaseURL is where the tools reach the daemon's API (its own listener,
	// over loopback when it listens on all addresses).
	BaseURL string
	// TLS is the client configuration for an https BaseURL.
	TLS *tls.Config
	// Limits bound the tools (zero: DefaultLimits).
	Limits Limits
	// TokenRequired says the daemon admits no request without a token.
	// Then the SDK's DNS-rebinding check (a non-localhost Host arriving on
	// a loopback address is refused) is off: a rebound page cannot send
	// the token, and a reverse proxy on the same host (which sends its own
	// Host to 127.0.0.1) must work. Without auth the check stays on.
	TokenRequired bool
	Logger        *slog.Logger
}

// maxClients bounds the API clients Handler keeps, one per token.
const maxClients = 64

// Handler serves MCP's streamable HTTP transport, stateless: every request
// gets a server whose tools carry that request's bearer token (none when
// the daemon needs none) and its Host, so they act exactly as the caller
// may. Mount it behind the daemon's auth, which has already checked the
// token. Sandboxes it creates are labelled sbx-mcp=1 and live for their
// timeout (default one hour): a stateless endpoint has no session end.
func Handler(cfg HTTPConfig) http.Handler {
	if cfg.Limits == (Limits{}) {
		cfg.Limits = DefaultLimits
	}
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetHTTP2(true)
	tr := &http.Transport{Protocols: &protos, TLSClientConfig: cfg.TLS, MaxIdleConnsPerHost: 16, IdleConnTimeout: time.Minute}
	var mu sync.Mutex
	backends := map[[sha256.Size]byte]*Backend{}
	backend := func(token, host string) *Backend {
		key := sha256.Sum256([]byte(token + "\x00" + host))
		mu.Lock()
		defer mu.Unlock()
		if b, ok := backends[key]; ok {
			return b
		}
		if len(backends) >= maxClients {
			clear(backends)
		}
		b := NewBackend(&http.Client{Transport: &BearerTransport{Base: tr, Token: token, Host: host}}, cfg.BaseURL)
		backends[key] = b
		return b
	}
	h := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		return NewServer(backend(bearer(r), r.Host), cfg.Limits, nil)
	}, &mcp.StreamableHTTPOptions{
		Stateless: true, JSONResponse: true, Logger: cfg.Logger,
		DisableLocalhostProtection: cfg.TokenRequired,
		// Room for a file of MaxInputBytes as base64 in JSON, no more.
		MaxRequestBodyBytes: int64(cfg.Limits.MaxInputBytes)*4/3 + 64<<10,
	})
	// Without a token (a daemon with no auth), a web page must still not
	// drive the tools from a browser.
	return http.NewCrossOriginProtection().Handler(h)
}

// bearer returns the token of an "Authorization: Bearer T" header.
func bearer(r *http.Request) string {
	v := r.Header.Get("Authorization")
	if len(v) > 7 && (v[:7] == "Bearer " || v[:7] == "bearer ") {
		return v[7:]
	}
	return ""
}
