package agent

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/seccomp"
)

// Options is what cmd/sbx-agent parsed from its command line.
type Options struct {
	// ListenFD is an inherited listening socket (the production way); -1 if unset.
	ListenFD int
	// Listen is an address "unix:/path" to listen on instead (tests).
	Listen string
	// ReadyFD, if not -1, is an inherited pipe on which the agent writes
	// ReadyByte and which it closes once it serves.
	ReadyFD int
	// ExecFD, if not -1, is an inherited listening socket for the framed exec
	// protocol (api/execframe).
	ExecFD int
	// ExecListen is an address "unix:/path" to serve framed execs on
	// instead of ExecFD (drivers that cannot hand over sockets: gvisor).
	ExecListen string
	// TLSDir holds the TLS files of tls: listeners (see LoadTLSDir); the
	// agent removes them once read.
	TLSDir string
	// Seccomp installs the sandbox's default seccomp filter (internal/seccomp)
	// on every thread before anything else; a failure is fatal. The OCI
	// driver sets it instead of having the runtime compile the profile.
	Seccomp bool
	// NoFile, if not 0, is the RLIMIT_NOFILE (soft and hard) of the agent
	// and everything it starts, set before anything runs (see setNoFile);
	// 0 raises the soft limit to the inherited hard one.
	NoFile uint64
	// UserCgroupFDs are inherited `tasks` files of the box's user cgroups
	// (one per cgroup v1 hierarchy): every user process is forked from a
	// thread moved there (see spawner).
	UserCgroupFDs []int
	// Entrypoint, if set, is started at boot in the background.
	Entrypoint []string
	// Logger is the agent's log; nil means a text logger on stderr.
	Logger *slog.Logger
}

// agentSoftMemoryLimit is the Go runtime's soft memory limit in the agent.
const agentSoftMemoryLimit = 20 << 20

// Run is the whole agent: harden, listen, start the entrypoint, serve until
// ctx ends. As PID 1 ctx never ends.
func Run(ctx context.Context, opts Options) error {
	if opts.Seccomp {
		// First: no user process can exist before it, and every one the
		// agent starts inherits it.
		if err := installSeccomp(); err != nil {
			return err
		}
	}
	// The agent's memory is its reserve beside user code (at most 32 MiB,
	// see the oci driver's agentMemoryReserve): a soft limit makes the GC
	// collect and return garbage (output pumped through it, say) before the
	// heap grows into that, at some CPU cost only while near it.
	debug.SetMemoryLimit(agentSoftMemoryLimit)
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if err := setNoFile(opts.NoFile); err != nil {
		return err
	}
	if err := harden(); err != nil {
		log.Warn("hardening agent", "err", err)
	}
	var tlsConf *tls.Config
	if opts.TLSDir != "" {
		var err error
		if tlsConf, err = LoadTLSDir(opts.TLSDir); err != nil {
			return err
		}
	}
	ln, err := listen(opts.ListenFD, opts.Listen, "listen", tlsConf)
	if err != nil {
		return err
	}
	defer ln.Close()
	ln = patient(ln, log)
	var execLn net.Listener
	if opts.ExecFD >= 0 || opts.ExecListen != "" {
		if execLn, err = listen(opts.ExecFD, opts.ExecListen, "exec", tlsConf); err != nil {
			return err
		}
		defer execLn.Close()
		execLn = patient(execLn, log)
	}
	closeOnExecAll()

	pid1 := os.Getpid() == 1
	if !pid1 {
		// Orphans of our children come back to us rather than to the real init.
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err == nil {
			pid1 = true
		}
	}
	srv, err := NewServer(Config{Env: ownEnv(), Logger: log, ReapAll: pid1, Lockdown: true})
	if err != nil {
		return err
	}
	if len(opts.UserCgroupFDs) > 0 {
		if srv.spawner, err = newSpawner(opts.UserCgroupFDs); err != nil {
			return err
		}
		srv.writer = &fileWriter{start: srv.startFileWriter}
	}
	if len(opts.Entrypoint) > 0 {
		if err := srv.startEntrypoint(opts.Entrypoint); err != nil {
			log.Error("starting entrypoint", "argv", opts.Entrypoint, "err", err)
		}
	}
	log.Info("sbx-agent serving", "version", Version, "pid", os.Getpid(), "addr", ln.Addr().String())
	if execLn != nil {
		go func() {
			if err := srv.ServeExec(ctx, execLn); err != nil {
				log.Error("serving framed execs", "err", err)
			}
		}()
	}
	if opts.ReadyFD >= 0 {
		// The listener already queues connections; Serve accepts them next.
		signalReady(opts.ReadyFD, log)
	}
	return srv.Serve(ctx, ln)
}

// ownEnv is the agent's environment as the base of execs. HOME=/root is
// dropped: OCI runtimes set it for the agent (root) when the sandbox's
// environment has no HOME, and it must not stick to other users, whose HOME
// defaults to their passwd entry's (root gets /root back by the same rule).
func ownEnv() []string {
	env := os.Environ()
	if envLookup(env, "HOME") != "/root" {
		return env
	}
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, "HOME=") {
			out = append(out, kv)
		}
	}
	return out
}

// installSeccomp installs the sandbox's default seccomp filter.
func installSeccomp() error {
	prog, err := seccomp.Compile(seccomp.Default())
	if err == nil {
		err = seccomp.Install(prog)
	}
	if err != nil {
		return fmt.Errorf("seccomp: %w", err)
	}
	return nil
}

// signalReady writes the ready byte on fd and closes it.
func signalReady(fd int, log *slog.Logger) {
	f := os.NewFile(uintptr(fd), "ready-fd")
	if f == nil {
		log.Warn("ready fd is not valid", "fd", fd)
		return
	}
	defer f.Close()
	if _, err := f.Write([]byte{ReadyByte}); err != nil {
		log.Warn("signalling ready", "err", err)
	}
}

// listenFD serves on an inherited listening socket. The fd is dup'ed
// close-on-exec by FileListener; the original is closed so user processes
// can never inherit it.
func listenFD(fd int, name string) (net.Listener, error) {
	unix.CloseOnExec(fd)
	f := os.NewFile(uintptr(fd), name)
	if f == nil {
		return nil, fmt.Errorf("%s %d is not valid", name, fd)
	}
	defer f.Close()
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("using %s %d: %w", name, fd, err)
	}
	return ln, nil
}

// listen serves on the inherited socket fd or on addr ("unix:/path", or
// "tls:host:port" with tlsConf, from --tls-dir): --NAME-fd or --NAME.
func listen(fd int, addr, name string, tlsConf *tls.Config) (net.Listener, error) {
	switch {
	case fd >= 0 && addr != "":
		return nil, fmt.Errorf("--%s-fd and --%s are exclusive", name, name)
	case fd >= 0:
		return listenFD(fd, name+"-fd")
	case strings.HasPrefix(addr, "unix:"):
		path := strings.TrimPrefix(addr, "unix:")
		os.Remove(path)
		ln, err := net.Listen("unix", path)
		if err != nil {
			return nil, fmt.Errorf("listening on %s: %w", path, err)
		}
		return ln, nil
	case strings.HasPrefix(addr, "tls:"):
		if tlsConf == nil {
			return nil, fmt.Errorf("--%s %s needs --tls-dir", name, addr)
		}
		ln, err := net.Listen("tcp", strings.TrimPrefix(addr, "tls:"))
		if err != nil {
			return nil, fmt.Errorf("listening on %s: %w", addr, err)
		}
		return newTLSListener(ln, tlsConf), nil
	default:
		return nil, fmt.Errorf("need --%s-fd N, --%s unix:/path or --%s tls:host:port (got %q)", name, name, name, addr)
	}
}
