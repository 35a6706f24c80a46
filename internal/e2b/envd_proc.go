package e2b

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	"github.com/sbxdev/sbx/api/gen/e2b/process"
	"github.com/sbxdev/sbx/api/gen/e2b/process/processconnect"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// Processes are sbx's background processes (ProcessService): Start starts
// one and follows it (start{pid} first, then its output, then end), so the
// command outlives the stream as envd's does, and any client can List,
// Connect to (output from the moment of connecting, as envd's), signal,
// feed or resize it by pid or tag. E2B's pid is the process's pid in the
// sandbox.

// procServer is envd's process.Process over sbx's ProcessService.
type procServer struct {
	processconnect.UnimplementedProcessHandler
	h *Handler
}

// userOf returns the user of envd's "Authorization: Basic base64(user:)"
// header: E2B's SDK names the user per call. Only "root" changes
// anything; E2B's default "user" runs as the sandbox's own user.
func userOf(h string) string {
	v, ok := strings.CutPrefix(h, "Basic ")
	if !ok {
		return ""
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(v))
	if err != nil {
		return ""
	}
	u, _, _ := strings.Cut(string(b), ":")
	if u == "root" {
		return "root"
	}
	return ""
}

// selector names a process for sbx: its pid (decimal) or its tag.
func selector(sel *process.ProcessSelector) (string, error) {
	switch s := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		return strconv.FormatUint(uint64(s.Pid), 10), nil
	case *process.ProcessSelector_Tag:
		if s.Tag == "" {
			return "", connect.NewError(connect.CodeInvalidArgument, errors.New("process.tag: empty"))
		}
		return s.Tag, nil
	}
	return "", connect.NewError(connect.CodeInvalidArgument, errors.New("process: give a pid or a tag"))
}

// follow relays sbx process events as envd's until the process exits or
// ctx ends. tty output is envd's pty data.
func follow(st *connect.ServerStreamForClient[sbxv1.ProcessEvent], tty bool, send func(*process.ProcessEvent) error) error {
	for st.Receive() {
		var data *process.ProcessEvent_DataEvent
		switch ev := st.Msg().GetEvent().(type) {
		case *sbxv1.ProcessEvent_Stdout:
			if tty {
				data = &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Pty{Pty: ev.Stdout}}
			} else {
				data = &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: ev.Stdout}}
			}
		case *sbxv1.ProcessEvent_Stderr:
			data = &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stderr{Stderr: ev.Stderr}}
		case *sbxv1.ProcessEvent_Keepalive:
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case *sbxv1.ProcessEvent_Exited:
			return send(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: endOf(ev.Exited)}})
		}
		if data != nil {
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: data}}); err != nil {
				return err
			}
		}
	}
	if err := st.Err(); err != nil {
		return fmt.Errorf("following the process: %w", err)
	}
	return nil
}

func (s *procServer) Start(ctx context.Context, req *connect.Request[process.StartRequest], st *connect.ServerStream[process.StartResponse]) error {
	cl := callOf(ctx)
	m := req.Msg
	cfg := m.GetProcess()
	if cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("start: process.cmd is required"))
	}
	exec := &sbxv1.ExecRequest{
		Sandbox: cl.sandbox, Argv: append([]string{cfg.GetCmd()}, cfg.GetArgs()...), Env: cfg.GetEnvs(),
		Workdir: cfg.GetCwd(), User: userOf(req.Header().Get("Authorization")), StdinOpen: m.GetStdin(),
	}
	if pty := m.GetPty(); pty != nil {
		exec.Tty, exec.StdinOpen = true, true
		exec.Size = &sbxv1.TerminalSize{Rows: pty.GetSize().GetRows(), Cols: pty.GetSize().GetCols()}
	}
	started, err := cl.c.processes.StartProcess(ctx, connect.NewRequest(&sbxv1.StartProcessRequest{Exec: exec, Tag: m.GetTag()}))
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	info := started.Msg.GetProcess()
	// start{pid} goes out before following: the SDK waits for it to
	// return from commands.run, so it must not wait for anything else.
	send := func(ev *process.ProcessEvent) error { return st.Send(&process.StartResponse{Event: ev}) }
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: uint32(info.GetPid())}}}); err != nil {
		return err
	}
	// Follow from the first byte: the ring holds what it wrote meanwhile.
	fl, err := cl.c.processes.ConnectProcess(ctx, connect.NewRequest(&sbxv1.ConnectProcessRequest{Sandbox: cl.sandbox, Process: info.GetId(), Follow: true}))
	if err != nil {
		return fmt.Errorf("start: following process %s: %w", info.GetId(), err)
	}
	defer fl.Close()
	return follow(fl, exec.Tty, send)
}

func endOf(x *sbxv1.ExecExited) *process.ProcessEvent_EndEvent {
	end := &process.ProcessEvent_EndEvent{ExitCode: x.GetExitCode(), Exited: x.GetSignal() == 0, Status: fmt.Sprintf("exit status %d", x.GetExitCode())}
	if x.GetSignal() != 0 {
		end.Status = fmt.Sprintf("signal: %d", x.GetSignal())
		if x.GetExitCode() == 0 {
			end.ExitCode = -1
		}
	}
	msg := x.GetError()
	switch {
	case x.GetTimedOut():
		msg = "timed out"
	case x.GetOomKilled():
		msg = "killed: out of memory"
	case x.GetPidsLimitHit() && msg == "":
		msg = "the sandbox's process limit was hit"
	}
	if msg != "" {
		end.Error = &msg
	}
	return end
}

func (s *procServer) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	cl := callOf(ctx)
	resp, err := cl.c.processes.ListProcesses(ctx, connect.NewRequest(&sbxv1.ListProcessesRequest{Sandbox: cl.sandbox}))
	if err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	out := &process.ListResponse{}
	for _, p := range resp.Msg.GetProcesses() {
		if !p.GetRunning() {
			continue
		}
		cmd := p.GetCommand()
		cfg := &process.ProcessConfig{Envs: p.GetEnv()}
		if len(cmd) > 0 {
			cfg.Cmd, cfg.Args = cmd[0], cmd[1:]
		}
		if wd := p.GetWorkdir(); wd != "" {
			cfg.Cwd = &wd
		}
		info := &process.ProcessInfo{Config: cfg, Pid: uint32(p.GetPid())}
		if t := p.GetTag(); t != "" {
			info.Tag = &t
		}
		out.Processes = append(out.Processes, info)
	}
	return connect.NewResponse(out), nil
}

func (s *procServer) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], st *connect.ServerStream[process.ConnectResponse]) error {
	cl := callOf(ctx)
	name, err := selector(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	// Following starts before start{pid} goes out: the SDK may send input
	// as soon as it has that event, and the output it causes must reach
	// this stream (tail 0: envd's Connect shows only output from now on).
	none := uint32(0)
	fl, err := cl.c.processes.ConnectProcess(ctx, connect.NewRequest(&sbxv1.ConnectProcessRequest{Sandbox: cl.sandbox, Process: name, Follow: true, Tail: &none}))
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer fl.Close()
	// sbx's first event is the process's info, sent at once.
	if !fl.Receive() {
		if err := fl.Err(); err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("connect: process %s: no such process", name))
	}
	info := fl.Msg().GetProcess()
	if info == nil || !info.GetRunning() {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("connect: process %s is not running", name))
	}
	send := func(ev *process.ProcessEvent) error { return st.Send(&process.ConnectResponse{Event: ev}) }
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: uint32(info.GetPid())}}}); err != nil {
		return err
	}
	return follow(fl, info.GetTty(), send)
}

func (s *procServer) input(ctx context.Context, sel *process.ProcessSelector, in *sbxv1.SendProcessInputRequest) error {
	cl := callOf(ctx)
	name, err := selector(sel)
	if err != nil {
		return err
	}
	in.Sandbox, in.Process = cl.sandbox, name
	if _, err := cl.c.processes.SendProcessInput(ctx, connect.NewRequest(in)); err != nil {
		return fmt.Errorf("input to process %s: %w", name, err)
	}
	return nil
}

func inputBytes(in *process.ProcessInput) []byte {
	if b := in.GetStdin(); b != nil {
		return b
	}
	return in.GetPty()
}

func (s *procServer) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	if err := s.input(ctx, req.Msg.GetProcess(), &sbxv1.SendProcessInputRequest{Stdin: inputBytes(req.Msg.GetInput())}); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

func (s *procServer) StreamInput(ctx context.Context, st *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	var sel *process.ProcessSelector
	for st.Receive() {
		switch ev := st.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			sel = ev.Start.GetProcess()
		case *process.StreamInputRequest_Data:
			if sel == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("stream input: data before start"))
			}
			if err := s.input(ctx, sel, &sbxv1.SendProcessInputRequest{Stdin: inputBytes(ev.Data.GetInput())}); err != nil {
				return nil, err
			}
		}
	}
	if err := st.Err(); err != nil {
		return nil, fmt.Errorf("stream input: %w", err)
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

func (s *procServer) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	if err := s.input(ctx, req.Msg.GetProcess(), &sbxv1.SendProcessInputRequest{StdinClose: true}); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

func (s *procServer) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	size := req.Msg.GetPty().GetSize()
	if size == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("update: pty.size is required"))
	}
	if err := s.input(ctx, req.Msg.GetProcess(), &sbxv1.SendProcessInputRequest{Resize: &sbxv1.TerminalSize{Rows: size.GetRows(), Cols: size.GetCols()}}); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}

func (s *procServer) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	cl := callOf(ctx)
	var sig int32
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL:
		sig = 9
	case process.Signal_SIGNAL_SIGTERM:
		sig = 15
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("send signal: %v: want SIGKILL or SIGTERM", req.Msg.GetSignal()))
	}
	name, err := selector(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if _, err := cl.c.processes.SignalProcess(ctx, connect.NewRequest(&sbxv1.SignalProcessRequest{Sandbox: cl.sandbox, Process: name, Signal: sig})); err != nil {
		return nil, fmt.Errorf("send signal to process %s: %w", name, err)
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}
