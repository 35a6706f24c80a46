// Package agent is sbx-agent, the init process of every sandbox. It owns the
// guest side: process, pty, files; imports no daemon code. It serves
// agent.v1.AgentService (Connect gRPC over unencrypted HTTP/2) on a listener
// handed to it by the runtime driver, reaps every zombie as PID 1, and runs
// every user command as a fresh fork/exec, never inside itself.
//
// Commands run as root or as the sandbox's users (see user.go); the agent
// itself, and with it every file operation, always stays root.
//
// Detached processes (detached_linux.go) are execs that outlive their
// stream, for the daemon's shell sessions and code kernels: a restarted
// daemon re-attaches to them by id; their output waits in a bounded buffer
// (outbuf.go) meanwhile. Background processes (background_linux.go) are
// detached processes any client starts, replays, feeds and waits for: their
// output goes to a ring (logring.go) like the entrypoint's.
//
// Path guards (Configure's path policies) are FUSE layers mounted by
// permfs; guards_linux.go holds the lockdown that drops CAP_SYS_ADMIN before
// any user process starts.
//
// Only cmd/sbx-agent imports this package. Its dependency budget (standard
// library, x/sys/unix, creack/pty, connect, protobuf, sbx api, go-fuse and
// internal/permrules) is enforced by deps_test.go because the binary ships
// in every sandbox.
package agent

import (
	"cmp"
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
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	agentv1 "github.com/sbxdev/sbx/api/gen/agent/v1"
	"github.com/sbxdev/sbx/api/gen/agent/v1/agentv1connect"
)

// Version is the agent's version, set with
// -ldflags "-X github.com/sbxdev/sbx/internal/agent.Version=...".
var Version = "dev"

// ProtocolVersion is the highest daemon↔agent protocol version this agent speaks.
// Version 2 added Attach, ListDetached and RemoveDetached; 3 added Logs and
// Wait; 4 added background processes (StartProcess, ProcessLogs,
// ProcessInput, WaitProcess, and their fields in DetachedProcess); 5 serves
// framed execs on the API endpoint too (mux_linux.go), so a driver needs
// to give the agent one endpoint only; 6 takes raw file connections there
// (rawfile_linux.go: a file's bytes spliced, not in messages).
const ProtocolVersion = 6

// DefaultPath is the PATH given to commands when the sandbox sets none.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/go/bin"

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
	// Lockdown makes the agent drop CAP_SYS_ADMIN before it starts the
	// first process (see guards_linux.go). Only the real agent sets it.
	Lockdown bool

	// passwdFile and groupFile are where users are looked up; "" means
	// /etc/passwd and /etc/group (tests point them elsewhere).
	passwdFile, groupFile string
	// outputLimit is Server.outputLimit; 0 means defaultOutputLimit
	// (tests make it small).
	outputLimit int
}

// Server implements agentv1connect.AgentServiceHandler.
type Server struct {
	agentv1connect.UnimplementedAgentServiceHandler

	log    *slog.Logger
	reaper *reaper
	// spawner forks user processes in the box's user cgroups; nil forks
	// from the calling thread. Set once, before the first process.
	spawner *spawner

	// passwdFile and groupFile are where users are looked up (fixed).
	passwdFile, groupFile string
	// outputLimit is how much of each stream the entrypoint's ring and a
	// detached process's buffer keep (fixed; each process takes it when
	// it starts).
	outputLimit int

	// mu guards the defaults. Configure replaces them (never mutates the
	// slice in place), so a snapshot taken under mu stays valid.
	mu      sync.Mutex
	env     []string // base environment, PATH ensured (HOME is per user)
	workdir string   // absolute default working directory
	user    string   // default user spec, validated; "" means root

	// configureMu serializes Configure calls and the starts of entry.
	configureMu sync.Mutex
	// entry is the entrypoint started last (entrypoint_linux.go); nil if
	// none was started.
	entry atomic.Pointer[entryProc]

	// lockMu guards lock: the path guards and whether CAP_SYS_ADMIN was
	// dropped. Taken after configureMu when both are held.
	lockMu sync.Mutex
	lock   lockdownState

	// detached holds the processes started by Attach (see detached_linux.go).
	detached detachedTable

	// files resolves every path a file request names (boxfs_linux.go).
	files *boxFS
	// writer writes the data of files written through the file API from
	// the user cgroups (filewriter_linux.go); nil writes from the agent
	// (no user cgroups). Set once, with spawner.
	writer *fileWriter
}

var _ agentv1connect.AgentServiceHandler = (*Server)(nil)

// NewServer returns a server with cfg's defaults. It starts the reaper.
func NewServer(cfg Config) (*Server, error) {
	env := cfg.Env
	if env == nil {
		env = os.Environ()
	}
	env = setDefault(env, "PATH", DefaultPath)
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
	files, err := newBoxFS()
	if err != nil {
		return nil, err
	}
	s := &Server{
		files:       files,
		env:         env,
		workdir:     wd,
		log:         log,
		reaper:      newReaper(cfg.ReapAll, log),
		passwdFile:  cfg.passwdFile,
		outputLimit: cmp.Or(cfg.outputLimit, defaultOutputLimit),
		groupFile:   cfg.groupFile,
	}
	s.lock.enabled = cfg.Lockdown
	if s.passwdFile == "" {
		s.passwdFile = passwdFile
	}
	if s.groupFile == "" {
		s.groupFile = groupFile
	}
	return s, nil
}

// Handler returns the HTTP handler serving AgentService.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	// The link is local (a Unix socket or vsock): compressing responses only
	// burns CPU. Compressed requests are still accepted.
	path, h := agentv1connect.NewAgentServiceHandler(s, connect.WithCompressMinBytes(math.MaxInt32))
	mux.Handle(path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == agentv1connect.AgentServiceExecProcedure {
			bw := &batchWriter{ResponseWriter: w}
			w, r = bw, r.WithContext(context.WithValue(r.Context(), batchWriterKey{}, bw))
		}
		h.ServeHTTP(w, r)
	}))
	return mux
}

// batchWriter lets the Exec handler suppress the flush connect does after
// every message, so that several messages leave in one HTTP/2 write (each
// flush is a round trip through the connection's writer).
type batchWriter struct {
	http.ResponseWriter
	// hold suppresses Flush. Only the handler goroutine, which is also the
	// only one sending, touches it.
	hold bool
}

type batchWriterKey struct{}

func (w *batchWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok && !w.hold {
		f.Flush()
	}
}

// Unwrap is for http.ResponseController.
func (w *batchWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// flushHolder is a stream's writer whose flushes an exec can hold back, so
// that its next message leaves in the same write.
type flushHolder interface{ setHold(bool) }

func (w *batchWriter) setHold(h bool) { w.hold = h }

// holderFrom returns the request's flushHolder, or nil.
func holderFrom(ctx context.Context) flushHolder {
	h, _ := ctx.Value(batchWriterKey{}).(flushHolder)
	return h
}

// Serve serves AgentService on ln until ctx ends, and framed execs on the
// connections that start with one (mux_linux.go).
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	ln = s.muxExec(ctx, ln)
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

// ReadyByte is what the agent writes on its --ready-fd once it serves (the
// daemon's side is agentconn.ReadyByte; the agent does not import it).
const ReadyByte = 'R'

// Hello negotiates the protocol version.
func (s *Server) Hello(_ context.Context, req *connect.Request[agentv1.HelloRequest]) (*connect.Response[agentv1.HelloResponse], error) {
	v := min(req.Msg.GetProtocolVersion(), ProtocolVersion)
	return connect.NewResponse(&agentv1.HelloResponse{
		ProtocolVersion: v,
		AgentVersion:    Version,
		Pid:             int32(os.Getpid()),
	}), nil
}

// defaults returns the base environment, default workdir and default user
// of a new exec. The slice must not be modified.
func (s *Server) defaults() (env []string, workdir, user string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.env, s.workdir, s.user
}

// lookupUser resolves a user spec in the sandbox's passwd and group files;
// "" is the default root (nil). An unknown or malformed user is an
// InvalidArgument error prefixed with op.
func (s *Server) lookupUser(op, spec string) (*userInfo, error) {
	if spec == "" {
		return nil, nil
	}
	u, err := lookupUser(spec, s.passwdFile, s.groupFile)
	if ue, ok := errors.AsType[*userError](err); ok {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s: %w", op, ue))
	}
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("%s: user %q: %w", op, spec, err))
	}
	return u, nil
}

// Configure mounts the request's path guards (only before any process has
// started), replaces the defaults of later execs, starts the entrypoint and
// drops CAP_SYS_ADMIN for good (see guards_linux.go).
// The request's user (empty: root) becomes the default user of later execs
// and runs the entrypoint. Nothing changes if any part of the request is
// rejected.
func (s *Server) Configure(_ context.Context, req *connect.Request[agentv1.ConfigureRequest]) (*connect.Response[agentv1.ConfigureResponse], error) {
	env, err := parseEnv(req.Msg.GetEnv())
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("configure: %w", err))
	}
	wd := req.Msg.GetWorkdir()
	if wd != "" {
		if !filepath.IsAbs(wd) || strings.ContainsRune(wd, 0) {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("configure: workdir %q is not an absolute path", wd))
		}
		wd = filepath.Clean(wd)
	}
	argv := req.Msg.GetCommand()
	if len(argv) > 0 && argv[0] == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("configure: command[0] is empty"))
	}
	userSpec := req.Msg.GetUser()
	user, err := s.lookupUser("configure", userSpec)
	if err != nil {
		return nil, err
	}

	s.configureMu.Lock()
	defer s.configureMu.Unlock()
	if old := s.entry.Load(); len(argv) > 0 && old != nil && !old.p.exited.Load() {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("configure: the entrypoint started before is still running"))
	}
	// Guards first: the workdir and the entrypoint may be below them.
	if err := s.mountGuards(req.Msg.GetPathPolicies()); err != nil {
		return nil, err
	}
	if wd == "" {
		_, wd, _ = s.defaults()
	} else if err := s.files.ensureDir(wd, 0o755); err != nil {
		return nil, fsError("configure: creating workdir", wd, err)
	}
	if len(argv) > 0 {
		if err := s.startEntrypointLocked(argv, env, wd, user); err != nil {
			if ce := new(connect.Error); errors.As(err, &ce) {
				return nil, connect.NewError(ce.Code(), fmt.Errorf("configure: starting command: %s", ce.Message()))
			}
			code := connect.CodeInternal
			if _, ok := errors.AsType[*startError](err); ok {
				code = connect.CodeFailedPrecondition // not found or not executable in this box
			}
			return nil, connect.NewError(code, fmt.Errorf("configure: starting command: %w", err))
		}
	}
	s.mu.Lock()
	s.env, s.workdir, s.user = env, wd, userSpec
	s.mu.Unlock()
	if err := s.lockdown(); err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("configure: %w", err))
	}
	s.log.Info("configured", "workdir", wd, "env", len(env), "user", userSpec, "command", argv)
	return connect.NewResponse(&agentv1.ConfigureResponse{}), nil
}

// parseEnv validates a KEY=VALUE list (a later KEY wins) and ensures PATH.
// HOME is defaulted per exec, from its user.
func parseEnv(kvs []string) ([]string, error) {
	env := make([]string, 0, len(kvs)+2)
	for _, kv := range kvs {
		k, _, ok := strings.Cut(kv, "=")
		switch {
		case !ok:
			return nil, fmt.Errorf("env entry %q is not KEY=VALUE", kv)
		case k == "":
			return nil, fmt.Errorf("env entry %q has an empty name", kv)
		case strings.ContainsRune(kv, 0):
			return nil, fmt.Errorf("env entry %q contains a NUL byte", kv)
		}
		if envHas(env, k) {
			env = envSet(env, k, kv[len(k)+1:])
		} else {
			env = append(env, kv)
		}
	}
	env = setDefault(env, "PATH", DefaultPath)
	return env, nil
}

// envHas reports whether key is set in env.
func envHas(env []string, key string) bool {
	for _, kv := range env {
		if len(kv) > len(key) && kv[len(key)] == '=' && kv[:len(key)] == key {
			return true
		}
	}
	return false
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
	if filepath.IsAbs(p) {
		return filepath.Clean(p)
	}
	_, wd, _ := s.defaults()
	return resolveIn(wd, p)
}

// resolveIn makes p absolute against dir and cleans it.
func resolveIn(dir, p string) string {
	if p == "" {
		return dir
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(dir, p)
	}
	return filepath.Clean(p)
}
