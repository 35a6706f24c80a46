// Package agent is sbx-agent, the init process of every sandbox. It owns the
// guest side: process, pty, files; imports no daemon code. It serves
// agent.v1.AgentService (Connect gRPC over unencrypted HTTP/2) on a listener
// handed to it by the runtime driver, reaps every zombie as PID 1, and runs
// every user command as a fresh fork/exec, never inside itself.
//
// Only cmd/sbx-agent imports this package. Its dependency budget (standard
// library, x/sys/unix, creack/pty, connect, protobuf, sbx api) is enforced by
// deps_test.go because the binary ships in every sandbox.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"connectrpc.com/connect"
	agentv1 "github.com/sbxdev/sbx/api/gen/agent/v1"
	"github.com/sbxdev/sbx/api/gen/agent/v1/agentv1connect"
)

// Version is the agent's version, set with
// -ldflags "-X github.com/sbxdev/sbx/internal/agent.Version=...".
var Version = "dev"

// ProtocolVersion is the highest daemon↔agent protocol version this agent speaks.
const ProtocolVersion = 1

// DefaultPath is the PATH given to commands when the sandbox sets none.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Config is the sandbox-wide defaults every exec starts from.
type Config struct {
	// Env is the base environment ("K=V"); nil means os.Environ().
	Env []string
	// Workdir is the default working directory; "" means the agent's own.
	Workdir string
	// Logger receives the agent's own log; nil means slog.Default().
	Logger *slog.Logger
	// ReapAll makes the reaper wait for any child (wait4(-1)), as PID 1 must.
	// When false only children the agent started are waited for.
	ReapAll bool
}

// Server implements agentv1connect.AgentServiceHandler.
type Server struct {
	agentv1connect.UnimplementedAgentServiceHandler

	env     []string // base environment, PATH and HOME ensured
	workdir string   // absolute default working directory
	log     *slog.Logger
	reaper  *reaper
}

var _ agentv1connect.AgentServiceHandler = (*Server)(nil)

// NewServer returns a server with cfg's defaults. It starts the reaper.
func NewServer(cfg Config) (*Server, error) {
	env := cfg.Env
	if env == nil {
		env = os.Environ()
	}
	env = setDefault(env, "PATH", DefaultPath)
	env = setDefault(env, "HOME", "/root")
	wd := cfg.Workdir
	if wd == "" {
		var err error
		if wd, err = os.Getwd(); err != nil {
			return nil, fmt.Errorf("getting working directory: %w", err)
		}
	}
	wd, err := filepath.Abs(wd)
	if err != nil {
		return nil, fmt.Errorf("resolving workdir: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Server{
		env:     env,
		workdir: wd,
		log:     log,
		reaper:  newReaper(cfg.ReapAll, log),
	}, nil
}

// Handler returns the HTTP handler serving AgentService.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	// The link is local (a Unix socket or vsock): compressing responses only
	// burns CPU. Compressed requests are still accepted.
	mux.Handle(agentv1connect.NewAgentServiceHandler(s, connect.WithCompressMinBytes(math.MaxInt32)))
	return mux
}

// Serve serves AgentService on ln until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	hs := &http.Server{
		Handler:           s.Handler(),
		Protocols:         &protos,
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	stop := context.AfterFunc(ctx, func() { hs.Close() })
	defer stop()
	err := hs.Serve(ln)
	if ctx.Err() != nil {
		return nil
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("serving agent API: %w", err)
}

// Hello negotiates the protocol version.
func (s *Server) Hello(_ context.Context, req *connect.Request[agentv1.HelloRequest]) (*connect.Response[agentv1.HelloResponse], error) {
	v := min(req.Msg.GetProtocolVersion(), ProtocolVersion)
	return connect.NewResponse(&agentv1.HelloResponse{
		ProtocolVersion: v,
		AgentVersion:    Version,
		Pid:             int32(os.Getpid()),
	}), nil
}

// setDefault sets key=val in env unless key is already present.
func setDefault(env []string, key, val string) []string {
	if envLookup(env, key) != "" {
		return env
	}
	return envSet(env, key, val)
}

// envLookup returns the last value of key in env.
func envLookup(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}

// envSet returns env with key set to val, replacing any earlier value.
func envSet(env []string, key, val string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k != key {
			out = append(out, kv)
		}
	}
	return append(out, key+"="+val)
}

// resolve makes p absolute against the default workdir and cleans it.
func (s *Server) resolve(p string) string {
	if p == "" {
		return s.workdir
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(s.workdir, p)
	}
	return filepath.Clean(p)
}
