package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	agentv1 "github.com/sbxdev/sbx/api/gen/agent/v1"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
	"github.com/sbxdev/sbx/internal/agentconn"
)

// Background processes (sbx.v1 ProcessService) live in the sandbox's
// agent (agent protocol 4): it holds the process, its output ring and its
// exit status, so they outlive the client that started them and a daemon
// restart, and the daemon keeps no record of them: every call asks the
// agent. What the agent reports is the sandbox's word (code in the box
// shares the agent's side of the boundary), so it is used only for that
// sandbox, its ids are checked, and its lists are bounded.

// processIDPrefix starts the ids the daemon gives background processes
// (sessions and contexts, also detached processes in the agent, have their
// own prefixes; the startup sweep of unrecorded ones leaves these alone).
const processIDPrefix = "proc-"

// maxListedProcesses bounds a process list taken from an agent: its
// running bound plus the exited records it keeps.
const maxListedProcesses = MaxBackgroundPerSandbox + 64

// processCallTimeout bounds the unary process calls on an agent.
const processCallTimeout = 30 * time.Second

// maxTagBytes bounds a process's tag (as the agent does).
const maxTagBytes = 256

// ProcessServer implements sbxv1connect.ProcessServiceHandler.
type ProcessServer struct{ s *Server }

var _ sbxv1connect.ProcessServiceHandler = (*ProcessServer)(nil)

// validProcessID reports whether id is one the daemon hands out: the
// prefix and 16 lowercase hex digits.
func validProcessID(id string) bool {
	hexPart, ok := strings.CutPrefix(id, processIDPrefix)
	if !ok || len(hexPart) != 16 {
		return false
	}
	_, err := hex.DecodeString(hexPart)
	return err == nil && strings.ToLower(hexPart) == hexPart
}

func newProcessID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return processIDPrefix + hex.EncodeToString(b[:])
}

// checkTag validates a tag given to StartProcess.
func checkTag(tag string) error {
	switch {
	case len(tag) > maxTagBytes:
		return fmt.Errorf("start process: tag is %d bytes, more than %d", len(tag), maxTagBytes)
	case !utf8.ValidString(tag) || strings.ContainsRune(tag, 0):
		return errors.New("start process: tag is not UTF-8 text without NUL bytes")
	case tag != "" && strings.Trim(tag, "0123456789") == "":
		return fmt.Errorf("start process: tag %q is all digits (it would read as a pid)", tag)
	case strings.HasPrefix(tag, processIDPrefix):
		return fmt.Errorf("start process: tag %q starts with %q (it would read as a process id)", tag, processIDPrefix)
	}
	return nil
}

// agentProcessError maps an agent's error on a process call: an agent
// older than protocol 4 says Unimplemented.
func agentProcessError(ctx context.Context, op string, err error) error {
	switch {
	case connect.CodeOf(err) == connect.CodeUnimplemented:
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%s: the sandbox's agent is too old for background processes (agent protocol 4 needed; recreate the sandbox)", op))
	case ctx.Err() != nil:
		return agentconn.ContextError(ctx)
	}
	if ce := new(connect.Error); errors.As(err, &ce) {
		return connect.NewError(ce.Code(), fmt.Errorf("%s: %s", op, ce.Message()))
	}
	return fmt.Errorf("%s: %w", op, err)
}

// agent returns sandbox ref's id and agent for one call, counted against
// the sandbox's running commands like every process call: a call holds a
// goroutine and an agent stream (a stdin write up to 5 s), so a client
// flooding them must meet the same bound as one flooding execs.
func (p *ProcessServer) agent(ctx context.Context, ref string) (string, *agentconn.Conn, func(), error) {
	conn, release, err := p.s.streams.exec(ctx, ref)
	if err != nil {
		return "", nil, nil, err
	}
	id, err := p.s.mgr.RunningID(ctx, ref)
	if err != nil {
		release()
		return "", nil, nil, toConnect(err)
	}
	return id, conn, release, nil
}

// list returns the sandbox's background processes as the agent reports
// them, oldest first, bounded and with well-formed ids only.
func list(ctx context.Context, conn *agentconn.Conn, sandbox string) ([]*sbxv1.ProcessInfo, error) {
	resp, err := conn.ListDetached(ctx, connect.NewRequest(&agentv1.ListDetachedRequest{}))
	if err != nil {
		return nil, agentProcessError(ctx, "listing processes", err)
	}
	var out []*sbxv1.ProcessInfo
	for _, d := range resp.Msg.GetProcesses() {
		if !d.GetBackground() || !validProcessID(d.GetId()) {
			continue
		}
		if len(out) == maxListedProcesses {
			break
		}
		out = append(out, processInfo(sandbox, d))
	}
	return out, nil
}

// processInfo converts an agent's record.
func processInfo(sandbox string, d *agentv1.DetachedProcess) *sbxv1.ProcessInfo {
	pi := &sbxv1.ProcessInfo{
		Id: d.GetId(), Pid: d.GetPid(), Sandbox: sandbox, Command: d.GetCommand(), Tag: d.GetTag(),
		Tty: d.GetTty(), StdinOpen: d.GetStdinOpen(), StartedMs: d.GetStartedMs(), Running: !d.GetExited(),
		ExitedMs: d.GetExitedMs(), DroppedStdoutBytes: d.GetDroppedStdout(), DroppedStderrBytes: d.GetDroppedStderr(),
		Env: d.GetEnv(), Workdir: d.GetWorkdir(),
	}
	if d.GetExited() {
		pi.Exited = d.GetExit()
		if pi.Exited == nil {
			pi.Exited = &sbxv1.ExecExited{ExitCode: d.GetExitCode(), Signal: d.GetSignal()}
		}
	}
	return pi
}

// resolve finds the process ref names among the sandbox's: an id, a pid
// (the running one first, else the newest) or a tag (one process only).
func resolve(ctx context.Context, conn *agentconn.Conn, sandbox, ref string) (*sbxv1.ProcessInfo, error) {
	if ref == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("name the process: its id, pid or tag"))
	}
	procs, err := list(ctx, conn, sandbox)
	if err != nil {
		return nil, err
	}
	var found []*sbxv1.ProcessInfo
	pid, perr := strconv.ParseInt(ref, 10, 32)
	for _, pi := range procs {
		switch {
		case pi.GetId() == ref:
			return pi, nil
		case perr == nil && int64(pi.GetPid()) == pid, perr != nil && pi.GetTag() == ref:
			found = append(found, pi)
		}
	}
	if perr == nil {
		var best *sbxv1.ProcessInfo
		for _, pi := range found { // oldest first: the last one wins
			if best == nil || !best.GetRunning() || pi.GetRunning() {
				best = pi
			}
		}
		if best != nil {
			return best, nil
		}
	}
	switch len(found) {
	case 0:
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("sandbox %s has no background process %q (by id, pid or tag)", sandbox, ref))
	case 1:
		return found[0], nil
	}
	return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("tag %q names %d processes in sandbox %s: use an id", ref, len(found), sandbox))
}

// withProcess resolves ref in sandbox ref sb and calls f with it.
func (p *ProcessServer) withProcess(ctx context.Context, sb, ref string, f func(context.Context, *agentconn.Conn, *sbxv1.ProcessInfo) error) error {
	ctx, cancel := context.WithTimeout(ctx, processCallTimeout)
	defer cancel()
	id, conn, release, err := p.agent(ctx, sb)
	if err != nil {
		return err
	}
	defer release()
	pi, err := resolve(ctx, conn, id, ref)
	if err != nil {
		return err
	}
	return f(ctx, conn, pi)
}

func (p *ProcessServer) StartProcess(ctx context.Context, req *connect.Request[sbxv1.StartProcessRequest]) (*connect.Response[sbxv1.StartProcessResponse], error) {
	ex := req.Msg.GetExec()
	if err := validateExec(ex); err != nil {
		return nil, err
	}
	if err := checkTag(req.Msg.GetTag()); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	ctx, cancel := context.WithTimeout(ctx, processCallTimeout)
	defer cancel()
	sb, conn, release, err := p.agent(ctx, ex.GetSandbox())
	if err != nil {
		return nil, err
	}
	defer release()
	limit := p.s.streams.background
	id := newProcessID()
	resp, err := conn.StartProcess(ctx, connect.NewRequest(&agentv1.StartProcessRequest{
		Id: id, Exec: ex, Tag: req.Msg.GetTag(), MaxRunning: uint32(limit),
	}))
	if connect.CodeOf(err) == connect.CodeResourceExhausted {
		return nil, connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("sandbox %s runs %d background processes, the most allowed (sbx serve --exec-max-background): wait for or remove one", sb, limit))
	}
	if err != nil {
		return nil, agentProcessError(ctx, "start process", err)
	}
	pi := processInfo(sb, resp.Msg.GetProcess())
	pi.Id = id // the one asked for, whatever the agent says
	return connect.NewResponse(&sbxv1.StartProcessResponse{Process: pi}), nil
}

func (p *ProcessServer) ListProcesses(ctx context.Context, req *connect.Request[sbxv1.ListProcessesRequest]) (*connect.Response[sbxv1.ListProcessesResponse], error) {
	ctx, cancel := context.WithTimeout(ctx, processCallTimeout)
	defer cancel()
	sb, conn, release, err := p.agent(ctx, req.Msg.GetSandbox())
	if err != nil {
		return nil, err
	}
	defer release()
	procs, err := list(ctx, conn, sb)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sbxv1.ListProcessesResponse{Processes: procs}), nil
}

func (p *ProcessServer) GetProcess(ctx context.Context, req *connect.Request[sbxv1.GetProcessRequest]) (*connect.Response[sbxv1.GetProcessResponse], error) {
	var out *sbxv1.ProcessInfo
	err := p.withProcess(ctx, req.Msg.GetSandbox(), req.Msg.GetProcess(), func(_ context.Context, _ *agentconn.Conn, pi *sbxv1.ProcessInfo) error {
		out = pi
		return nil
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sbxv1.GetProcessResponse{Process: out}), nil
}

// ConnectProcess relays the process's output ring. A client following it
// is counted against the sandbox's running commands (--exec-max-streams).
func (p *ProcessServer) ConnectProcess(ctx context.Context, req *connect.Request[sbxv1.ConnectProcessRequest], out *connect.ServerStream[sbxv1.ProcessEvent]) error {
	sb, conn, release, err := p.agent(ctx, req.Msg.GetSandbox())
	if err != nil {
		return err
	}
	defer release()
	budget, done := p.s.streams.relay.acquire(sb)
	defer done()
	rctx, cancel := context.WithTimeout(ctx, processCallTimeout)
	pi, err := resolve(rctx, conn, sb, req.Msg.GetProcess())
	cancel()
	if err != nil {
		return err
	}
	// The info first: the agent's log stream answers only with its first
	// event, which for a silent process is its keepalive (10 s).
	if err := out.Send(&sbxv1.ProcessEvent{Event: &sbxv1.ProcessEvent_Process{Process: pi}}); err != nil {
		return err
	}
	st, err := conn.ProcessLogs(ctx, connect.NewRequest(&agentv1.ProcessLogsRequest{
		Id: pi.GetId(), Logs: &sbxv1.LogsRequest{Follow: req.Msg.GetFollow(), Tail: req.Msg.Tail},
	}))
	if err != nil {
		return agentProcessError(ctx, "connect process", err)
	}
	defer st.Close()
	for st.Receive() {
		var ev *sbxv1.ProcessEvent
		switch e := st.Msg().GetEvent().(type) {
		case *sbxv1.LogsEvent_Data:
			if e.Data.GetStderr() {
				ev = &sbxv1.ProcessEvent{Event: &sbxv1.ProcessEvent_Stderr{Stderr: e.Data.GetData()}}
			} else {
				ev = &sbxv1.ProcessEvent{Event: &sbxv1.ProcessEvent_Stdout{Stdout: e.Data.GetData()}}
			}
		case *sbxv1.LogsEvent_Dropped:
			ev = &sbxv1.ProcessEvent{Event: &sbxv1.ProcessEvent_Dropped{Dropped: e.Dropped}}
		case *sbxv1.LogsEvent_Keepalive:
			ev = &sbxv1.ProcessEvent{Event: &sbxv1.ProcessEvent_Keepalive{Keepalive: e.Keepalive}}
		case *sbxv1.LogsEvent_Exited:
			p.s.markProcessOOM(ctx, sb, e.Exited)
			ev = &sbxv1.ProcessEvent{Event: &sbxv1.ProcessEvent_Exited{Exited: e.Exited}}
		default:
			continue
		}
		if err := budget.spend(ctx, len(ev.GetStdout())+len(ev.GetStderr())); err != nil {
			return err
		}
		if err := out.Send(ev); err != nil {
			return err
		}
	}
	if err := st.Err(); err != nil {
		return agentProcessError(ctx, "connect process", err)
	}
	return nil
}

func (p *ProcessServer) SendProcessInput(ctx context.Context, req *connect.Request[sbxv1.SendProcessInputRequest]) (*connect.Response[sbxv1.SendProcessInputResponse], error) {
	var ins []*sbxv1.ExecInput
	if len(req.Msg.GetStdin()) > 0 {
		ins = append(ins, &sbxv1.ExecInput{Event: &sbxv1.ExecInput_Stdin{Stdin: req.Msg.GetStdin()}})
	}
	if req.Msg.GetStdinClose() {
		ins = append(ins, &sbxv1.ExecInput{Event: &sbxv1.ExecInput_StdinClose{StdinClose: true}})
	}
	if r := req.Msg.GetResize(); r != nil {
		if r.GetRows() == 0 || r.GetCols() == 0 || r.GetRows() > 65535 || r.GetCols() > 65535 {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("send process input: terminal size %dx%d: want rows and cols from 1 to 65535", r.GetRows(), r.GetCols()))
		}
		ins = append(ins, &sbxv1.ExecInput{Event: &sbxv1.ExecInput_Resize{Resize: r}})
	}
	if len(ins) == 0 {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("send process input: nothing to send (give stdin, stdin_close or resize)"))
	}
	err := p.withProcess(ctx, req.Msg.GetSandbox(), req.Msg.GetProcess(), func(ctx context.Context, conn *agentconn.Conn, pi *sbxv1.ProcessInfo) error {
		_, err := conn.ProcessInput(ctx, connect.NewRequest(&agentv1.ProcessInputRequest{Id: pi.GetId(), Inputs: ins}))
		if err != nil {
			return agentProcessError(ctx, "send process input", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sbxv1.SendProcessInputResponse{}), nil
}

func (p *ProcessServer) SignalProcess(ctx context.Context, req *connect.Request[sbxv1.SignalProcessRequest]) (*connect.Response[sbxv1.SignalProcessResponse], error) {
	sig := req.Msg.GetSignal()
	if sig == 0 {
		sig = 9
	}
	if sig < 1 || sig > 64 {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal process: signal %d is not 1 to 64", sig))
	}
	err := p.withProcess(ctx, req.Msg.GetSandbox(), req.Msg.GetProcess(), func(ctx context.Context, conn *agentconn.Conn, pi *sbxv1.ProcessInfo) error {
		_, err := conn.ProcessInput(ctx, connect.NewRequest(&agentv1.ProcessInputRequest{
			Id: pi.GetId(), Inputs: []*sbxv1.ExecInput{{Event: &sbxv1.ExecInput_Signal{Signal: sig}}},
		}))
		if err != nil {
			return agentProcessError(ctx, "signal process", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sbxv1.SignalProcessResponse{}), nil
}

// WaitProcess waits for the process's exit. A waiter is counted against
// the sandbox's running commands, like a follower.
func (p *ProcessServer) WaitProcess(ctx context.Context, req *connect.Request[sbxv1.WaitProcessRequest]) (*connect.Response[sbxv1.WaitProcessResponse], error) {
	sb, conn, release, err := p.agent(ctx, req.Msg.GetSandbox())
	if err != nil {
		return nil, err
	}
	defer release()
	rctx, cancel := context.WithTimeout(ctx, processCallTimeout)
	pi, err := resolve(rctx, conn, sb, req.Msg.GetProcess())
	cancel()
	if err != nil {
		return nil, err
	}
	resp, err := conn.WaitProcess(ctx, connect.NewRequest(&agentv1.WaitProcessRequest{Id: pi.GetId()}))
	if err != nil {
		return nil, agentProcessError(ctx, "wait process", err)
	}
	id := pi.GetId()
	pi = processInfo(sb, resp.Msg.GetProcess())
	pi.Id = id // the one asked for, whatever the agent says
	p.s.markProcessOOM(ctx, sb, pi.GetExited())
	return connect.NewResponse(&sbxv1.WaitProcessResponse{Process: pi}), nil
}

func (p *ProcessServer) RemoveProcess(ctx context.Context, req *connect.Request[sbxv1.RemoveProcessRequest]) (*connect.Response[sbxv1.RemoveProcessResponse], error) {
	err := p.withProcess(ctx, req.Msg.GetSandbox(), req.Msg.GetProcess(), func(ctx context.Context, conn *agentconn.Conn, pi *sbxv1.ProcessInfo) error {
		_, err := conn.RemoveDetached(ctx, connect.NewRequest(&agentv1.RemoveDetachedRequest{Id: pi.GetId()}))
		if err != nil {
			return agentProcessError(ctx, "remove process", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sbxv1.RemoveProcessResponse{}), nil
}

// markProcessOOM sets oom_killed on the exit of a background process
// killed by SIGKILL (or a shell reporting 137) if the sandbox's memory limit
// killed a process since the daemon last looked. (The sandbox's own command
// is marked over its own life: sandbox.Manager.MarkEntrypoint.)
func (s *Server) markProcessOOM(ctx context.Context, sandbox string, ex *sbxv1.ExecExited) {
	if ex != nil && (ex.GetSignal() == 9 || ex.GetExitCode() == 137) && s.mgr.OOMKilled(ctx, sandbox) {
		ex.OomKilled = true
	}
}
