// Package codeexec runs code in sandboxes through their agents; it knows
// languages (which toolchain, how to compile and run, which installer),
// kernels (stateful contexts), artifacts (plots and files the code writes
// under $SBX_OUTPUT_DIR) and the code policy checked before running. It
// uses the agent's file API, exec streams and detached processes (sessions
// and contexts, which survive a daemon restart: detached.go).
// Only internal/server and internal/daemon import it.
package codeexec

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/agentconn"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/store"
)

// Directories inside the sandbox. Each run gets RunDir/<id> for its code
// and OutputsDir/<id> (exported as $SBX_OUTPUT_DIR) for its artifacts; both
// are removed once the result is sent.
const (
	RunDir     = "/tmp/sbx-code"
	OutputsDir = "/tmp/outputs"
)

// Limits on what is returned as artifacts.
const (
	maxArtifacts     = 64
	maxArtifactBytes = 64 << 20 // all artifacts of one run together
	// Python code up to this size is passed as an argument, not written to a file.
	maxInlineCode = 64 << 10
)

// The python scripts: plotly.py (the plotly capture hook) and notebook.py
// (plt.show() capture, display(), !cmd and %pip) are prepended to both the
// one-shot runner and the kernel. One-shot runs start boot.py,
// which imports the runner from runnerLib in the sandbox (written there on
// first use) so that Python loads it from its bytecode cache instead of
// compiling it every time; runnerLib's name carries the runner's hash.
var (
	//go:embed kernels/plotly.py
	plotlyHook string
	//go:embed kernels/notebook.py
	notebookHook string
	//go:embed kernels/runner.py
	runnerScript string
	//go:embed kernels/boot.py
	pythonBoot string

	pythonPrelude = plotlyHook + notebookHook
	pythonRunner  = pythonPrelude + runnerScript
	runnerLib     = func() string {
		sum := sha256.Sum256([]byte(pythonRunner))
		return RunDir + "/lib/sbx_runner_" + hex.EncodeToString(sum[:8])
	}()
)

// Agents hands out agent clients of running sandboxes (sandbox.Manager).
type Agents interface {
	Agent(ctx context.Context, ref string) (conn *agentconn.Conn, release func(), err error)
	// Sees reports whether ctx's caller may see sandbox id (tenancy: a
	// session or context of a sandbox out of sight does not exist for it).
	Sees(ctx context.Context, id string) bool
	// ResolveID returns the id of the sandbox with id or name ref as ctx's
	// caller sees it: sessions and contexts record ids, never names (names
	// are per tenant).
	ResolveID(ctx context.Context, ref string) (string, error)
}

// Limit admits one command relayed for a client (a code run, a session
// command) into sandbox id, counted against that sandbox's bound on running
// commands; call release when its relay ends. An error (ResourceExhausted
// naming the bound) refuses it. spend (nil: none) charges each output event
// relayed for the command, n bytes of data, to the sandbox's output relay
// budget, the one its exec output, logs and process followers share
// (--exec-relay-rate): it waits until the budget has them or ctx ends, so a
// flooding run's output is read from the agent no faster than the budget
// allows. internal/server's Streams provides it.
type Limit func(ctx context.Context, id string) (spend Spend, release func(), err error)

// Spend charges an output event of n bytes to a sandbox's relay budget,
// waiting until the budget has them or ctx ends.
type Spend func(ctx context.Context, n int) error

// budgeted returns sink with every output event charged to spend first.
func budgeted(ctx context.Context, sink Sink, spend Spend) Sink {
	return charged(ctx, sink, spend, func(ev *sbxv1.RunCodeEvent) (int, bool) {
		switch e := ev.GetEvent().(type) {
		case *sbxv1.RunCodeEvent_Stdout:
			return len(e.Stdout), true
		case *sbxv1.RunCodeEvent_Stderr:
			return len(e.Stderr), true
		}
		return 0, false
	})
}

// charged returns sink with each event that output says is output charged
// to spend (its byte count) before it is passed on; other events pass
// free. A nil spend charges nothing.
func charged[E any](ctx context.Context, sink func(E) error, spend Spend, output func(E) (int, bool)) func(E) error {
	if spend == nil {
		return sink
	}
	return func(ev E) error {
		if n, ok := output(ev); ok {
			if err := spend(ctx, n); err != nil {
				return err
			}
		}
		return sink(ev)
	}
}

// Sink receives a run's events: output chunks, then the result.
type Sink func(*sbxv1.RunCodeEvent) error

// Service runs code. With a store (UseStore), its contexts survive a
// daemon restart (see RestoreContexts). It is safe for concurrent use.
type Service struct {
	agents Agents
	log    *slog.Logger
	store  ProcessStore // nil: contexts are not persisted
	// stopping is set by Shutdown: kernel streams that end then leave the
	// kernels and their records alone.
	stopping atomic.Bool
	// contexts are the live contexts by id.
	contexts *registry[*kernel]
	limit    Limit // nil: no bound
}

// SetLimit counts every code run against its sandbox's bound on running
// commands. Call it before serving.
func (s *Service) SetLimit(l Limit) { s.limit = l }

// New returns a Service over agents.
func New(agents Agents, log *slog.Logger) *Service {
	if log == nil {
		log = slog.Default()
	}
	s := &Service{agents: agents, log: log}
	s.contexts = &registry[*kernel]{kind: store.ProcessContext, noun: "context", what: "code context", proc: "kernel",
		log: log, agents: agents, restore: s.restoreContext, live: map[string]*kernel{}}
	return s
}

// UseStore makes s persist its contexts in st. Call it before any CreateContext.
func (s *Service) UseStore(st ProcessStore) { s.store = st; s.contexts.useStore(st) }

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// RunCode runs req, sending output and then the result to sink.
func (s *Service) RunCode(ctx context.Context, req *sbxv1.RunCodeRequest, sink Sink) error {
	start := time.Now()
	if req.GetTimeoutMs() < 0 {
		return fmt.Errorf("run code: negative timeout: %w", errdefs.ErrInvalidArgument)
	}
	for _, l := range req.GetLibraries() {
		if l == "" || strings.HasPrefix(l, "-") {
			return fmt.Errorf("run code: bad library name %q: %w", l, errdefs.ErrInvalidArgument)
		}
	}
	if req.GetContext() != "" {
		// With a shared store this holds the context's lease for the run.
		return s.contexts.use(ctx, req.GetContext(), func(k *kernel) error { return s.runCode(ctx, req, k, start, sink) })
	}
	return s.runCode(ctx, req, nil, start, sink)
}

// runCode is RunCode in k, or in a one-shot interpreter when k is nil.
func (s *Service) runCode(ctx context.Context, req *sbxv1.RunCodeRequest, k *kernel, start time.Time, sink Sink) error {
	langName := req.GetLanguage()
	if k != nil {
		langName = k.lang.name
	}
	lang, err := lookupLanguage(langName)
	if err != nil {
		return err
	}
	if len(req.GetLibraries()) > 0 && lang.install == nil {
		return errNoInstaller(lang)
	}
	findings, err := checkPolicy(lang.name, req.GetCode(), req.GetPolicy())
	if err != nil {
		return err
	}
	sandboxRef := req.GetSandbox()
	if k != nil {
		sandboxRef = k.sandbox
	}
	if s.limit != nil {
		id, err := s.agents.ResolveID(ctx, sandboxRef)
		if err != nil {
			return err
		}
		spend, done, err := s.limit(ctx, id)
		if err != nil {
			return err
		}
		defer done()
		sandboxRef = id
		// Its output (a context's kernel's too) costs the sandbox's relay
		// budget, as an exec's does.
		sink = budgeted(ctx, sink, spend)
	}
	conn, release, err := s.agents.Agent(ctx, sandboxRef)
	if err != nil {
		return err
	}
	defer release()
	res := &sbxv1.RunCodeResult{Findings: findings, Context: req.GetContext()}
	if len(req.GetLibraries()) > 0 {
		installed, err := s.install(ctx, conn, lang, req)
		if err != nil {
			res.Error, res.ExitCode = err.Error(), 1
			res.DurationMs = time.Since(start).Milliseconds()
			return sink(&sbxv1.RunCodeEvent{Event: &sbxv1.RunCodeEvent_Result{Result: res}})
		}
		res.Installed = installed
	}
	id := newID()
	out := OutputsDir + "/" + id
	look := true
	if k != nil {
		look, err = k.run(ctx, req, out, res, sink)
	} else {
		look, err = s.oneShot(ctx, conn, lang, req, id, out, res, sink)
	}
	if err != nil {
		return err
	}
	found := false
	if look {
		res.Artifacts, found = collectArtifacts(ctx, conn, out)
	}
	if found || k == nil && (lang.name != "python" || !pythonInline(req.GetCode())) {
		s.cleanup(sandboxRef, RunDir+"/"+id, out)
	}
	res.DurationMs = time.Since(start).Milliseconds()
	return sink(&sbxv1.RunCodeEvent{Event: &sbxv1.RunCodeEvent_Result{Result: res}})
}

// oneShot writes the code into the sandbox and runs it (compiling first if
// the language needs it), streaming its output. look is false when the
// outputs dir is known to be gone (the python runner removes it when empty).
func (s *Service) oneShot(ctx context.Context, conn *agentconn.Conn, lang *language, req *sbxv1.RunCodeRequest,
	id, out string, res *sbxv1.RunCodeResult, sink Sink) (look bool, err error) {
	dir := RunDir + "/" + id
	file := lang.sourceFile(req.GetCode())
	env := map[string]string{"SBX_OUTPUT_DIR": out, "MPLBACKEND": "Agg", "SBX_SOURCE": file, "SBX_MAIN": strings.TrimSuffix(file, ".java")}
	for k, v := range req.GetEnv() {
		env[k] = v
	}
	stdout := sinkWriter(sink, false)
	stderr := sinkWriter(sink, true)
	deadline := time.Duration(req.GetTimeoutMs()) * time.Millisecond
	started := time.Now()
	remaining := func() int64 {
		if deadline == 0 {
			return 0
		}
		return max(1, (deadline - time.Since(started)).Milliseconds())
	}
	if lang.name == "python" {
		// Fast path: no shell, no probe (a missing python3 shows as a start
		// error), for code that fits in an argument no file to write, and
		// no look for artifacts when the runner says it left none.
		argv := []string{"python3", "-c", pythonBoot, runnerLib, pythonRunner, dir + "/" + file}
		if pythonInline(req.GetCode()) {
			argv = append(argv, req.GetCode())
		} else if err := writeFile(ctx, conn, dir+"/"+file, []byte(req.GetCode())); err != nil {
			return false, err
		}
		token := "\x1esbx-" + newID() + ":"
		env["SBX_RUN_TOKEN"] = token
		marks := &splitter{token: []byte(token)}
		empty := false
		errw := writerFunc(func(p []byte) (int, error) {
			user, msgs := marks.feed(p)
			empty = empty || slices.Contains(msgs, "empty")
			return len(p), sendChunk(sink, user, true)
		})
		ex, err := execute(ctx, conn, &sbxv1.ExecRequest{Argv: argv, Env: env, TimeoutMs: remaining()}, stdout, errw)
		if err != nil {
			return false, err
		}
		if err := sendChunk(sink, marks.buf, true); err != nil { // an unfinished line that looked like a mark
			return false, err
		}
		if ex.GetError() != "" && ex.GetExitCode() == 127 {
			return false, errUnavailable(lang)
		}
		fillExit(res, ex, "")
		return !empty, nil
	}
	if err := writeFile(ctx, conn, dir+"/"+file, []byte(req.GetCode())); err != nil {
		return false, err
	}
	if err := s.probe(ctx, conn, lang); err != nil {
		return false, err
	}
	if lang.compile != "" {
		ex, err := execute(ctx, conn, &sbxv1.ExecRequest{Shell: lang.compile, Env: env, Workdir: dir, TimeoutMs: remaining()}, stdout, stderr)
		if err != nil {
			return false, err
		}
		if ex.GetExitCode() != 0 || ex.GetError() != "" {
			fillExit(res, ex, "compilation failed")
			return true, nil
		}
	}
	run := `mkdir -p "$SBX_OUTPUT_DIR"; ` + lang.run
	ex, err := execute(ctx, conn, &sbxv1.ExecRequest{Shell: run, Env: env, Workdir: dir, TimeoutMs: remaining()}, stdout, stderr)
	if err != nil {
		return false, err
	}
	fillExit(res, ex, "")
	return true, nil
}

// pythonInline says whether python code is passed to the runner as an
// argument (no file written).
func pythonInline(code string) bool {
	return len(code) <= maxInlineCode && !strings.ContainsRune(code, 0)
}

func fillExit(res *sbxv1.RunCodeResult, ex *sbxv1.ExecExited, failed string) {
	res.ExitCode, res.TimedOut = ex.GetExitCode(), ex.GetTimedOut()
	switch {
	case ex.GetTimedOut():
		res.Error = "timed out"
	case ex.GetError() != "":
		res.Error = ex.GetError()
	case failed != "":
		res.Error = fmt.Sprintf("%s (exit code %d)", failed, ex.GetExitCode())
	case ex.GetSignal() != 0:
		res.Error = fmt.Sprintf("killed by signal %d", ex.GetSignal())
	case ex.GetExitCode() != 0:
		res.Error = fmt.Sprintf("exit code %d", ex.GetExitCode())
	}
}

// probe fails with errUnavailable when none of lang's tools is in PATH.
func (s *Service) probe(ctx context.Context, conn *agentconn.Conn, lang *language) error {
	var cmd []string
	for _, t := range lang.tools {
		cmd = append(cmd, "command -v "+shQuote(t)+" >/dev/null 2>&1")
	}
	ex, err := execute(ctx, conn, &sbxv1.ExecRequest{Shell: strings.Join(cmd, " || "), TimeoutMs: 10000}, io.Discard, io.Discard)
	if err != nil {
		return err
	}
	if ex.GetExitCode() != 0 {
		return errUnavailable(lang)
	}
	return nil
}

// install runs lang's installer for req's libraries and returns what it installed.
func (s *Service) install(ctx context.Context, conn *agentconn.Conn, lang *language, req *sbxv1.RunCodeRequest) ([]string, error) {
	if lang.install == nil {
		return nil, errNoInstaller(lang)
	}
	if err := s.probe(ctx, conn, lang); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	ex, err := execute(ctx, conn, &sbxv1.ExecRequest{
		Shell: lang.install(req.GetLibraries(), req.GetLibrarySource()), Env: req.GetEnv(), TimeoutMs: 10 * 60 * 1000,
	}, &buf, &buf)
	if err != nil {
		return nil, err
	}
	if ex.GetExitCode() != 0 || ex.GetError() != "" {
		return nil, fmt.Errorf("installing %s failed (exit code %d): %s", strings.Join(req.GetLibraries(), ", "), ex.GetExitCode(), tailString(buf.String(), 2000))
	}
	return installedFrom(lang, req.GetLibraries(), buf.String()), nil
}

func tailString(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// cleanup removes a run's directories in the background.
func (s *Service) cleanup(sandbox string, dirs ...string) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, release, err := s.agents.Agent(ctx, sandbox)
		if err != nil {
			return
		}
		defer release()
		for _, d := range dirs {
			_, _ = conn.Remove(ctx, connect.NewRequest(&sbxv1.RemoveRequest{Path: d, Recursive: true}))
		}
	}()
}

// sinkWriter turns writes into stdout or stderr events.
func sinkWriter(sink Sink, stderr bool) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		b := bytes.Clone(p)
		ev := &sbxv1.RunCodeEvent{Event: &sbxv1.RunCodeEvent_Stdout{Stdout: b}}
		if stderr {
			ev = &sbxv1.RunCodeEvent{Event: &sbxv1.RunCodeEvent_Stderr{Stderr: b}}
		}
		if err := sink(ev); err != nil {
			return 0, err
		}
		return len(p), nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// execute runs req through the agent, copying its output to stdout and stderr.
func execute(ctx context.Context, conn *agentconn.Conn, req *sbxv1.ExecRequest, stdout, stderr io.Writer) (*sbxv1.ExecExited, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st := conn.Exec(ctx)
	defer st.CloseResponse() //nolint:errcheck
	if err := st.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Start{Start: req}}); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("exec: sending start: %w", err)
	}
	_ = st.CloseRequest()
	for {
		msg, err := st.Receive()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, fmt.Errorf("exec: stream ended without an exit status: %w", errdefs.ErrUnavailable)
			}
			return nil, fmt.Errorf("exec: %w", err)
		}
		switch ev := msg.GetEvent().(type) {
		case *sbxv1.ExecOutput_Stdout:
			if _, err := stdout.Write(ev.Stdout); err != nil {
				return nil, err
			}
		case *sbxv1.ExecOutput_Stderr:
			if _, err := stderr.Write(ev.Stderr); err != nil {
				return nil, err
			}
		case *sbxv1.ExecOutput_Exited:
			return ev.Exited, nil
		}
	}
}

// writeFile writes data to path in the sandbox, creating parent directories.
func writeFile(ctx context.Context, conn *agentconn.Conn, path string, data []byte) error {
	st := conn.WriteFile(ctx)
	if err := st.Send(&sbxv1.WriteFileRequest{Msg: &sbxv1.WriteFileRequest_Header{Header: &sbxv1.WriteFileHeader{Path: path, MakeParents: true}}}); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("write %s: %w", path, err)
	}
	for len(data) > 0 {
		n := min(len(data), 1<<20)
		if err := st.Send(&sbxv1.WriteFileRequest{Msg: &sbxv1.WriteFileRequest_Data{Data: data[:n]}}); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return fmt.Errorf("write %s: %w", path, err)
		}
		data = data[n:]
	}
	if _, err := st.CloseAndReceive(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// readFile reads a whole file from the sandbox.
func readFile(ctx context.Context, conn *agentconn.Conn, path string) ([]byte, error) {
	st, err := conn.ReadFile(ctx, connect.NewRequest(&sbxv1.ReadFileRequest{Path: path}))
	if err != nil {
		return nil, err
	}
	defer st.Close()
	var buf bytes.Buffer
	for st.Receive() {
		buf.Write(st.Msg().GetData())
	}
	return buf.Bytes(), st.Err()
}
