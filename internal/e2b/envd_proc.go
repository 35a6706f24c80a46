package e2b

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"

	"connectrpc.com/connect"

	"github.com/sbxdev/sbx/api/gen/e2b/process"
	"github.com/sbxdev/sbx/api/gen/e2b/process/processconnect"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// Processes. Start runs the command with sbx's Exec and streams its
// output as envd's events (start{pid} first, then data, then end). The
// pid is a number this daemon gives the command (sbx's Exec reports no
// pid); the commands live in procTable for as long as they run, so that
// List, Connect (live output from the moment of connecting: no replay),
// SendSignal (SIGKILL/SIGTERM end the command: its Exec call is
// cancelled) and Update find them. Stdin and PTYs are not offered: Start
// with stdin or a pty, SendInput, StreamInput and CloseStdin answer
// Unimplemented.

// maxProcsPerSandbox bounds the commands tracked per sandbox (running
// Start streams); sbx's own exec limits apply as well.
const maxProcsPerSandbox = 256

// subBuffer is how many events a Connect subscriber may fall behind before
// it is cut off.
const subBuffer = 256

type proc struct {
	pid    uint32
	tag    string
	config *process.ProcessConfig
	cancel context.CancelFunc

	mu   sync.Mutex
	subs map[chan *process.ProcessEvent]bool
	done bool
}

// publish hands ev to every subscriber; one that cannot keep up is dropped
// (its channel closed), never waited for.
func (p *proc) publish(ev *process.ProcessEvent, last bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ch := range p.subs {
		select {
		case ch <- ev:
		default:
			delete(p.subs, ch)
			close(ch)
		}
	}
	if last {
		p.done = true
		for ch := range p.subs {
			close(ch)
		}
		clear(p.subs)
	}
}

func (p *proc) subscribe() (chan *process.ProcessEvent, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return nil, false
	}
	ch := make(chan *process.ProcessEvent, subBuffer)
	p.subs[ch] = true
	return ch, true
}

func (p *proc) unsubscribe(ch chan *process.ProcessEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.subs[ch] {
		delete(p.subs, ch)
		close(ch)
	}
}

// procTable holds the running commands by sandbox id and pid.
type procTable struct {
	mu   sync.Mutex
	next uint32
	// bySandbox is keyed by the sandbox as the caller named it and by
	// the token's hash, so two tenants naming the same id never share.
	bySandbox map[string]map[uint32]*proc
}

func newProcTable() *procTable {
	return &procTable{next: 1000, bySandbox: map[string]map[uint32]*proc{}}
}

func procKey(cl call) string { return cl.sandbox + "\x00" + cl.c.token }

func (t *procTable) add(cl call, p *proc) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.bySandbox[procKey(cl)]
	if m == nil {
		m = map[uint32]*proc{}
		t.bySandbox[procKey(cl)] = m
	}
	if len(m) >= maxProcsPerSandbox {
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("sandbox %s has %d commands running through the E2B API, the most it may", cl.sandbox, len(m)))
	}
	t.next++
	p.pid = t.next
	m[p.pid] = p
	return nil
}

func (t *procTable) remove(cl call, pid uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.bySandbox[procKey(cl)], pid)
	if len(t.bySandbox[procKey(cl)]) == 0 {
		delete(t.bySandbox, procKey(cl))
	}
}

// forget cancels every command of sandbox id (it was killed).
func (t *procTable) forget(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, m := range t.bySandbox {
		if strings.HasPrefix(k, id+"\x00") {
			for _, p := range m {
				p.cancel()
			}
		}
	}
}

func (t *procTable) list(cl call) []*proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*proc
	for _, p := range t.bySandbox[procKey(cl)] {
		out = append(out, p)
	}
	return out
}

func (t *procTable) find(cl call, sel *process.ProcessSelector) (*proc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.bySandbox[procKey(cl)] {
		switch s := sel.GetSelector().(type) {
		case *process.ProcessSelector_Pid:
			if p.pid == s.Pid {
				return p, nil
			}
		case *process.ProcessSelector_Tag:
			if p.tag == s.Tag {
				return p, nil
			}
		}
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %v not found in sandbox %s", sel, cl.sandbox))
}

// procServer is envd's process.Process over sbx's Exec.
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

func (s *procServer) Start(ctx context.Context, req *connect.Request[process.StartRequest], st *connect.ServerStream[process.StartResponse]) error {
	cl := callOf(ctx)
	m := req.Msg
	if m.GetPty() != nil {
		return connect.NewError(connect.CodeUnimplemented, errors.New("start: PTYs are not supported by sbx's E2B API (use sbx's exec with a tty)"))
	}
	if m.GetStdin() {
		return connect.NewError(connect.CodeUnimplemented, errors.New("start: stdin is not supported by sbx's E2B API"))
	}
	cfg := m.GetProcess()
	if cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("start: process.cmd is required"))
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	p := &proc{tag: m.GetTag(), config: cfg, cancel: cancel, subs: map[chan *process.ProcessEvent]bool{}}
	if err := s.h.procs.add(cl, p); err != nil {
		return err
	}
	defer s.h.procs.remove(cl, p.pid)
	exec, err := cl.c.sandboxes.Exec(runCtx, connect.NewRequest(&sbxv1.ExecRequest{
		Sandbox: cl.sandbox, Argv: append([]string{cfg.GetCmd()}, cfg.GetArgs()...), Env: cfg.GetEnvs(),
		Workdir: cfg.GetCwd(), User: userOf(req.Header().Get("Authorization")),
	}))
	if err != nil {
		p.publish(nil, true)
		return fmt.Errorf("start: %w", err)
	}
	defer exec.Close()
	send := func(ev *process.ProcessEvent, last bool) error {
		p.publish(ev, last)
		return st.Send(&process.StartResponse{Event: ev})
	}
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: p.pid}}}, false); err != nil {
		p.publish(nil, true)
		return err
	}
	var end *process.ProcessEvent_EndEvent
	for exec.Receive() {
		var data *process.ProcessEvent_DataEvent
		switch ev := exec.Msg().GetEvent().(type) {
		case *sbxv1.ExecOutput_Stdout:
			data = &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: ev.Stdout}}
		case *sbxv1.ExecOutput_Stderr:
			data = &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stderr{Stderr: ev.Stderr}}
		case *sbxv1.ExecOutput_Exited:
			end = endOf(ev.Exited)
		}
		if data != nil {
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: data}}, false); err != nil {
				p.publish(nil, true)
				return err
			}
		}
	}
	if end == nil {
		// Cancelled by SendSignal, or the stream broke.
		msg := "killed"
		if err := exec.Err(); err != nil && runCtx.Err() == nil {
			msg = err.Error()
		}
		end = &process.ProcessEvent_EndEvent{ExitCode: -1, Exited: false, Status: "signal: killed", Error: &msg}
	}
	return send(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}}, true)
}

func endOf(x *sbxv1.ExecExited) *process.ProcessEvent_EndEvent {
	end := &process.ProcessEvent_EndEvent{ExitCode: x.GetExitCode(), Exited: x.GetSignal() == 0, Status: fmt.Sprintf("exit status %d", x.GetExitCode())}
	if x.GetSignal() != 0 {
		end.Status = fmt.Sprintf("signal: %d", x.GetSignal())
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
	// The sandbox must exist for this caller (and be theirs).
	if _, err := cl.c.sandboxes.GetSandbox(ctx, connect.NewRequest(&sbxv1.GetSandboxRequest{Sandbox: cl.sandbox})); err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	out := &process.ListResponse{}
	for _, p := range s.h.procs.list(cl) {
		info := &process.ProcessInfo{Config: p.config, Pid: p.pid}
		if p.tag != "" {
			t := p.tag
			info.Tag = &t
		}
		out.Processes = append(out.Processes, info)
	}
	return connect.NewResponse(out), nil
}

func (s *procServer) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], st *connect.ServerStream[process.ConnectResponse]) error {
	cl := callOf(ctx)
	p, err := s.h.procs.find(cl, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	ch, ok := p.subscribe()
	if !ok {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("process %d has ended", p.pid))
	}
	defer p.unsubscribe(ch)
	if err := st.Send(&process.ConnectResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: p.pid}}}}); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-ch:
			if !ok {
				return nil
			}
			if ev == nil {
				continue
			}
			if err := st.Send(&process.ConnectResponse{Event: ev}); err != nil {
				return err
			}
		}
	}
}

func (s *procServer) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	cl := callOf(ctx)
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL, process.Signal_SIGNAL_SIGTERM:
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("send signal: %v: want SIGKILL or SIGTERM", req.Msg.GetSignal()))
	}
	p, err := s.h.procs.find(cl, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	p.cancel()
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}
