package codeexec

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/store"
)

//go:embed kernels/kernel.py
var kernelScript string

//go:embed kernels/kernel.js
var jsKernel string

var kernelScripts = map[string]string{"kernel.py": pythonPrelude + kernelScript, "kernel.js": jsKernel}

// kernel is one context: a long-lived interpreter in the sandbox, a
// detached process of the sandbox's agent (id = context id) the daemon
// attaches to, so it survives a daemon restart. Requests are JSON lines on
// its stdin; user output flows on its stdout/stderr, and each request ends
// with token+reply JSON on stdout and token+id on stderr.
type kernel struct {
	owner       *Service
	id, sandbox string
	lang        *language
	created     time.Time
	token       []byte
	cancel      context.CancelFunc
	stream      *procStream
	// events carries the stream's output; closed when the stream ends.
	events     chan *sbxv1.ExecOutput
	runs       atomic.Int64
	dead       atomic.Bool
	forgetOnce sync.Once
	// elsewhere is set once another replica took the process over (or
	// this one let it go for one that did): it is left alone.
	elsewhere atomic.Bool

	// mu serializes runs.
	mu sync.Mutex
	// reqID numbers requests. It starts from the clock (in microseconds,
	// exact in a JavaScript number), so the reply to a request cut off by
	// a daemon restart never matches a later request.
	reqID int64
}

type kernelReply struct {
	ID int64 `json:"id"`
	OK bool  `json:"ok"`
	// Artifacts is set when the outputs dir is not empty (the kernel removes it when it is).
	Artifacts bool   `json:"artifacts"`
	Error     string `json:"error"`
	Value     *struct {
		Text string `json:"text"`
		PNG  []byte `json:"png"` // base64 in JSON
		HTML string `json:"html"`
	} `json:"value"`
}

// CreateContext starts a kernel for req.Language in req.Sandbox.
func (s *Service) CreateContext(ctx context.Context, req *sbxv1.CreateContextRequest) (*sbxv1.CodeContext, error) {
	lang, err := lookupLanguage(req.GetLanguage())
	if err != nil {
		return nil, err
	}
	if lang.kernel == "" {
		return nil, fmt.Errorf("language %s has no stateful contexts (python and javascript do): %w", lang.name, errdefs.ErrInvalidArgument)
	}
	sbID, err := s.agents.ResolveID(ctx, req.GetSandbox())
	if err != nil {
		return nil, err
	}
	conn, release, err := s.agents.Agent(ctx, sbID)
	if err != nil {
		return nil, err
	}
	defer release()
	id := contextPrefix + newID()
	script := RunDir + "/kernels/" + lang.kernel
	if err := writeFile(ctx, conn, script, []byte(kernelScripts[lang.kernel])); err != nil {
		return nil, err
	}
	k := &kernel{
		owner: s, id: id, sandbox: sbID, lang: lang, created: time.Now(),
		token: []byte("\x1esbx-" + newID() + ":"), events: make(chan *sbxv1.ExecOutput, 256),
		reqID: time.Now().UnixMicro(),
	}
	env := map[string]string{"SBX_KERNEL": script, "SBX_KERNEL_TOKEN": string(k.token), "MPLBACKEND": "Agg"}
	for key, v := range req.GetEnv() {
		env[key] = v
	}
	// The kernel outlives this request: its stream hangs off a context of its own.
	kctx, cancel := context.WithCancel(context.Background())
	k.cancel = cancel
	start := &sbxv1.ExecRequest{Shell: lang.kernelCmd, Env: env, Workdir: req.GetCwd(), StdinOpen: true}
	if k.stream, err = attach(ctx, kctx, cancel, conn, id, start); err != nil {
		return nil, fmt.Errorf("create context: starting kernel: %w", err)
	}
	go k.read(s)
	// A first, empty run proves the kernel is up (and warms it).
	res := &sbxv1.RunCodeResult{}
	if _, err := k.run(ctx, &sbxv1.RunCodeRequest{TimeoutMs: 60000}, "", res, func(*sbxv1.RunCodeEvent) error { return nil }); err != nil || res.Error != "" {
		k.close()
		if err == nil && k.dead.Load() {
			if err := s.probe(ctx, conn, lang); err != nil {
				return nil, err
			}
			err = fmt.Errorf("create context: kernel failed to start: %s: %w", res.Error, errdefs.ErrUnavailable)
		}
		return nil, err
	}
	k.runs.Store(0)
	// Registered before its record exists, so that a record without a live
	// context is always one to restore.
	s.contexts.put(k)
	if s.store != nil {
		rec := &store.ProcessRecord{ID: id, Kind: store.ProcessContext, SandboxID: k.sandbox, Program: lang.name,
			Token: k.token, Workdir: req.GetCwd(), CreatedAtMs: k.created.UnixMilli(), Lease: s.contexts.newLease()}
		if err := s.store.PutProcess(ctx, rec); err != nil {
			s.contexts.drop(k)
			k.close()
			return nil, fmt.Errorf("create context: %w", err)
		}
	}
	s.log.Info("code context created", "context", id, "sandbox", k.sandbox, "language", lang.name)
	return k.info(), nil
}

// RestoreContexts re-attaches to the kernels of the persisted contexts
// (after the sandboxes were recovered). A context whose kernel is gone is
// dropped with a log line. The result of code that was running when the
// daemon stopped is lost.
func (s *Service) RestoreContexts(ctx context.Context) error {
	return s.contexts.restoreAll(ctx)
}

// restoreContext re-attaches r's kernel and registers it.
func (s *Service) restoreContext(ctx context.Context, r *store.ProcessRecord) error {
	lang, err := lookupLanguage(r.Program)
	if err != nil {
		return errors.Join(errdefs.ErrNotFound, err)
	}
	conn, release, err := s.agents.Agent(ctx, r.SandboxID)
	if err != nil {
		return err
	}
	defer release()
	k := &kernel{
		owner: s, id: r.ID, sandbox: r.SandboxID, lang: lang, created: time.UnixMilli(r.CreatedAtMs),
		token: r.Token, events: make(chan *sbxv1.ExecOutput, 256), reqID: time.Now().UnixMicro(),
	}
	if err := checkDetached(ctx, conn, r.ID); err != nil {
		return err
	}
	kctx, cancel := context.WithCancel(context.Background())
	k.cancel = cancel
	if k.stream, err = attach(ctx, kctx, cancel, conn, k.id, nil); err != nil {
		return err
	}
	s.contexts.put(k)
	go k.read(s)
	s.log.Info("code context re-attached", "context", r.ID, "sandbox", r.SandboxID, "language", r.Program)
	return nil
}

// Shutdown detaches from every kernel without stopping it and without
// forgetting its record, for a daemon that is stopping.
func (s *Service) Shutdown() {
	s.stopping.Store(true)
	for _, k := range s.contexts.all() {
		k.cancel()
	}
}

func (k *kernel) ident() (id, sandbox string) { return k.id, k.sandbox }

func (k *kernel) info() *sbxv1.CodeContext {
	return &sbxv1.CodeContext{Id: k.id, Sandbox: k.sandbox, Language: k.lang.name, CreatedMs: k.created.UnixMilli(), Runs: k.runs.Load()}
}

// read moves the stream's events to k.events until it ends, then forgets
// k (and, unless the daemon is stopping, its kernel and record).
func (k *kernel) read(s *Service) {
	defer func() {
		k.dead.Store(true)
		close(k.events)
		if !s.stopping.Load() {
			k.forget()
		}
		s.contexts.drop(k)
		k.cancel()
		k.stream.close()
	}()
	for {
		msg, err := k.stream.Receive()
		if err != nil {
			if connect.CodeOf(err) == connect.CodeAborted {
				// Another client attached: the agent gave it the process.
				k.elsewhere.Store(true)
			}
			return
		}
		k.events <- msg
		if msg.GetExited() != nil {
			return
		}
	}
}

// detach drops the stream and leaves the kernel and its record alone.
func (k *kernel) detach() {
	k.elsewhere.Store(true)
	k.cancel()
}

// close kills the kernel's process group, drops the stream and forgets the context.
func (k *kernel) close() {
	if !k.dead.Swap(true) && !k.elsewhere.Load() {
		_ = k.stream.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Signal{Signal: 9}})
	}
	k.cancel()
	k.forget()
}

// forget removes the context's record and its detached process, once.
func (k *kernel) forget() {
	if k.elsewhere.Load() {
		return // another replica's now
	}
	k.forgetOnce.Do(func() {
		forgetProcess(k.owner.agents, k.owner.store, k.owner.log, k.sandbox, k.id)
	})
}

// ListContexts lists live contexts, of one sandbox if sandbox is set.
func (s *Service) ListContexts(ctx context.Context, sandbox string) []*sbxv1.CodeContext {
	var out []*sbxv1.CodeContext
	live, others := s.contexts.list(ctx, sandbox)
	for _, k := range live {
		out = append(out, k.info())
	}
	for _, r := range others {
		out = append(out, &sbxv1.CodeContext{Id: r.ID, Sandbox: r.SandboxID, Language: r.Program, CreatedMs: r.CreatedAtMs})
	}
	return out
}

// CloseContext stops a context's kernel.
func (s *Service) CloseContext(ctx context.Context, id string) error {
	return s.contexts.close(ctx, id)
}

// run executes req.Code in the kernel, streaming output to sink and filling res.
func (k *kernel) run(ctx context.Context, req *sbxv1.RunCodeRequest, out string, res *sbxv1.RunCodeResult, sink Sink) (artifacts bool, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.dead.Load() {
		return false, fmt.Errorf("context %s has ended: %w", k.id, errdefs.ErrFailedPrecondition)
	}
	k.runs.Add(1)
	// Drop output left over from earlier runs (background threads, a run the client abandoned).
	for drained := false; !drained; {
		select {
		case _, ok := <-k.events:
			drained = !ok
		default:
			drained = true
		}
	}
	k.reqID++
	id := k.reqID
	line, _ := json.Marshal(map[string]any{"id": id, "code": req.GetCode(), "out": out})
	if err := k.stream.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Stdin{Stdin: append(line, '\n')}}); err != nil {
		k.close()
		return false, fmt.Errorf("context %s: sending code: %w", k.id, errdefs.ErrUnavailable)
	}
	var timeout <-chan time.Time
	if req.GetTimeoutMs() > 0 {
		t := time.NewTimer(time.Duration(req.GetTimeoutMs()) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	var hardKill <-chan time.Time
	interrupt := func() {
		_ = k.stream.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Signal{Signal: 2}})
	}
	stdout, stderr := &splitter{token: k.token}, &splitter{token: k.token}
	var reply *kernelReply
	stderrDone := false
	want := strconv.FormatInt(id, 10)
	for reply == nil || !stderrDone {
		select {
		case msg, ok := <-k.events:
			if !ok && k.elsewhere.Load() {
				return false, fmt.Errorf("context %s: another replica took its kernel over: %w", k.id, errdefs.ErrUnavailable)
			}
			if !ok || msg.GetExited() != nil {
				k.close()
				res.ExitCode, res.Error = 1, "the context's kernel exited"
				if ex := msg.GetExited(); ex != nil {
					res.Error = fmt.Sprintf("the context's kernel exited (exit code %d); the context is gone", ex.GetExitCode())
				}
				return true, nil
			}
			switch ev := msg.GetEvent().(type) {
			case *sbxv1.ExecOutput_Stdout:
				user, msgs := stdout.feed(ev.Stdout)
				if err := sendChunk(sink, user, false); err != nil {
					return false, err
				}
				for _, m := range msgs {
					var r kernelReply
					if json.Unmarshal([]byte(m), &r) == nil && r.ID == id {
						reply = &r
					}
				}
			case *sbxv1.ExecOutput_Stderr:
				user, msgs := stderr.feed(ev.Stderr)
				if err := sendChunk(sink, user, true); err != nil {
					return false, err
				}
				for _, m := range msgs {
					stderrDone = stderrDone || m == want
				}
			}
		case <-timeout:
			res.TimedOut = true
			interrupt()
			hardKill = time.After(5 * time.Second)
		case <-hardKill:
			k.close()
			res.ExitCode, res.Error = 1, "timed out; the kernel did not stop when interrupted, so the context was closed"
			return true, nil
		case <-ctx.Done():
			interrupt()
			return false, ctx.Err()
		}
	}
	if !reply.OK {
		res.ExitCode, res.Error = 1, reply.Error
		if res.TimedOut {
			res.Error = "timed out (" + reply.Error + ")"
		}
	}
	if v := reply.Value; v != nil {
		res.Value = &sbxv1.CodeValue{Text: v.Text, Png: v.PNG, Html: v.HTML}
	}
	return reply.Artifacts, nil
}

func sendChunk(sink Sink, b []byte, stderr bool) error {
	if len(b) == 0 {
		return nil
	}
	_, err := sinkWriter(sink, stderr).Write(b)
	return err
}

// splitter separates user output from token-prefixed protocol lines.
type splitter struct {
	token []byte
	buf   []byte
}

// feed adds p and returns the user bytes now known not to be protocol, and
// the payloads of complete protocol lines.
func (s *splitter) feed(p []byte) (user []byte, msgs []string) {
	s.buf = append(s.buf, p...)
	for {
		i := bytes.Index(s.buf, s.token)
		if i < 0 {
			keep := partialSuffix(s.buf, s.token)
			user = append(user, s.buf[:len(s.buf)-keep]...)
			s.buf = append([]byte(nil), s.buf[len(s.buf)-keep:]...)
			return user, msgs
		}
		user = append(user, s.buf[:i]...)
		rest := s.buf[i+len(s.token):]
		j := bytes.IndexByte(rest, '\n')
		if j < 0 {
			s.buf = append([]byte(nil), s.buf[i:]...)
			return user, msgs
		}
		msgs = append(msgs, string(rest[:j]))
		s.buf = rest[j+1:]
	}
}

// partialSuffix is the length of the longest proper prefix of token that b ends with.
func partialSuffix(b, token []byte) int {
	for k := min(len(token)-1, len(b)); k > 0; k-- {
		if bytes.HasSuffix(b, token[:k]) {
			return k
		}
	}
	return 0
}
