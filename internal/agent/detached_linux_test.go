package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	agentv1 "github.com/sbxdev/sbx/api/gen/agent/v1"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"golang.org/x/sys/unix"
)

type attachStream = connect.BidiStreamForClient[agentv1.AttachInput, agentv1.AttachOutput]

// attach opens an Attach stream for id (starting req if not nil) and
// returns it with its attached event.
func (a *testAgent) attach(t *testing.T, ctx context.Context, id string, req *sbxv1.ExecRequest) (*attachStream, *agentv1.AttachAttached) {
	t.Helper()
	st, att, err := a.tryAttach(ctx, id, req)
	if err != nil {
		t.Fatalf("attach %s: %v", id, err)
	}
	return st, att
}

func (a *testAgent) tryAttach(ctx context.Context, id string, req *sbxv1.ExecRequest) (*attachStream, *agentv1.AttachAttached, error) {
	st := a.conn.Attach(ctx)
	if err := st.Send(&agentv1.AttachInput{Event: &agentv1.AttachInput_Start{Start: &agentv1.AttachStart{Id: id, Exec: req}}}); err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, err
	}
	msg, err := st.Receive()
	if err != nil {
		return nil, nil, err
	}
	att := msg.GetAttached()
	if att == nil {
		return nil, nil, fmt.Errorf("first event: got %v, want attached", msg)
	}
	return st, att, nil
}

func stdin(s string) *agentv1.AttachInput {
	return &agentv1.AttachInput{Event: &agentv1.AttachInput_Input{Input: &sbxv1.ExecInput{Event: &sbxv1.ExecInput_Stdin{Stdin: []byte(s)}}}}
}

// readUntil reads stdout until it contains want; it returns all stdout read
// and the exited event if one came.
func readUntil(t *testing.T, st *attachStream, want string) (string, *sbxv1.ExecExited) {
	t.Helper()
	var out bytes.Buffer
	for !strings.Contains(out.String(), want) {
		msg, err := st.Receive()
		if err != nil {
			t.Fatalf("receive (waiting for %q, have %q): %v", want, out.String(), err)
		}
		o := msg.GetOutput()
		out.Write(o.GetStdout())
		if ex := o.GetExited(); ex != nil {
			return out.String(), ex
		}
	}
	return out.String(), nil
}

// readAll reads the stream to its exited event.
func readToExit(t *testing.T, st *attachStream) (string, *sbxv1.ExecExited) {
	t.Helper()
	var out bytes.Buffer
	for {
		msg, err := st.Receive()
		if err != nil {
			t.Fatalf("receive (have %q): %v", out.String(), err)
		}
		o := msg.GetOutput()
		out.Write(o.GetStdout())
		if ex := o.GetExited(); ex != nil {
			return out.String(), ex
		}
	}
}

// detach cancels the client's stream as a real client does (noticing the
// cancellation) and waits until the agent has seen it.
func (a *testAgent) detach(t *testing.T, st *attachStream, cancel context.CancelFunc, id string) {
	t.Helper()
	cancel()
	st.Receive()
	st.CloseResponse()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if p := a.listDetached(t)[id]; p == nil || !p.GetAttached() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("detached process %s: still attached after the client went away", id)
}

func (a *testAgent) listDetached(t *testing.T) map[string]*agentv1.DetachedProcess {
	t.Helper()
	resp, err := a.conn.ListDetached(context.Background(), connect.NewRequest(&agentv1.ListDetachedRequest{}))
	if err != nil {
		t.Fatalf("ListDetached: %v", err)
	}
	m := map[string]*agentv1.DetachedProcess{}
	for _, p := range resp.Msg.GetProcesses() {
		m[p.GetId()] = p
	}
	return m
}

// waitExited polls ListDetached until id has exited.
func (a *testAgent) waitExited(t *testing.T, id string) *agentv1.DetachedProcess {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if p := a.listDetached(t)[id]; p != nil && p.GetExited() {
			return p
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("detached process %s did not exit: %v", id, a.listDetached(t)[id])
	return nil
}

func TestDetachedSurvivesDetachAndReattach(t *testing.T) {
	a := newTestAgent(t)
	ctx1, cancel1 := context.WithTimeout(context.Background(), 30*time.Second)
	req := &sbxv1.ExecRequest{Shell: `echo ready; while read line; do echo "got $line"; [ "$line" = quit ] && exit 3; done`, StdinOpen: true}
	st, att := a.attach(t, ctx1, "p1", req)
	if att.GetPid() <= 0 {
		t.Fatalf("pid: got %d, want > 0", att.GetPid())
	}
	readUntil(t, st, "ready")
	if err := st.Send(stdin("one\n")); err != nil {
		t.Fatal(err)
	}
	readUntil(t, st, "got one")
	// The client goes away: the process must keep running.
	a.detach(t, st, cancel1, "p1")
	p := a.listDetached(t)["p1"]
	if p == nil || p.GetExited() {
		t.Fatalf("after detach: got %v, want a running process", p)
	}
	if p.GetPid() != att.GetPid() || strings.Join(p.GetCommand(), " ") != "/bin/sh -c "+req.GetShell() {
		t.Errorf("listed: got pid %d command %q, want pid %d and the shell command", p.GetPid(), p.GetCommand(), att.GetPid())
	}
	if err := unixKill0(int(att.GetPid())); err != nil {
		t.Fatalf("process %d after detach: %v", att.GetPid(), err)
	}

	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	st2, att2 := a.attach(t, ctx2, "p1", nil)
	if att2.GetPid() != att.GetPid() {
		t.Errorf("re-attached pid: got %d, want %d", att2.GetPid(), att.GetPid())
	}
	if err := st2.Send(stdin("two\nquit\n")); err != nil {
		t.Fatal(err)
	}
	out, ex := readToExit(t, st2)
	if !strings.Contains(out, "got two\ngot quit\n") {
		t.Errorf("output after re-attach: got %q, want got two, got quit", out)
	}
	if ex.GetExitCode() != 3 {
		t.Errorf("exit code: got %d, want 3", ex.GetExitCode())
	}
	// Delivered: collected.
	if p := a.listDetached(t)["p1"]; p != nil {
		t.Errorf("after exit was delivered: got %v, want no process", p)
	}
	_, _, err := a.tryAttach(ctx2, "p1", nil)
	if got := connect.CodeOf(err); got != connect.CodeNotFound {
		t.Errorf("attach after collection: got %v, want NotFound", err)
	}
}

func TestDetachedExitStatusKept(t *testing.T) {
	a := newTestAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sctx, scancel := context.WithCancel(ctx)
	st, _ := a.attach(t, sctx, "done", &sbxv1.ExecRequest{Shell: "sleep 0.2; echo out; echo err >&2; exit 7"})
	a.detach(t, st, scancel, "done") // before it writes anything
	p := a.waitExited(t, "done")
	if p.GetExitCode() != 7 || p.GetAttached() {
		t.Errorf("listed: got exit %d attached %v, want 7, false", p.GetExitCode(), p.GetAttached())
	}
	if got, want := p.GetBufferedBytes(), uint64(len("out\nerr\n")); got != want {
		t.Errorf("buffered: got %d, want %d", got, want)
	}
	// Still there a while later: kept until collected.
	time.Sleep(100 * time.Millisecond)
	st, _ = a.attach(t, ctx, "done", nil)
	var out, errb bytes.Buffer
	var ex *sbxv1.ExecExited
	for ex == nil {
		msg, err := st.Receive()
		if err != nil {
			t.Fatal(err)
		}
		out.Write(msg.GetOutput().GetStdout())
		errb.Write(msg.GetOutput().GetStderr())
		ex = msg.GetOutput().GetExited()
	}
	if out.String() != "out\n" || errb.String() != "err\n" || ex.GetExitCode() != 7 {
		t.Errorf("re-attach: got stdout %q stderr %q exit %d, want out, err, 7", out.String(), errb.String(), ex.GetExitCode())
	}
}

func TestDetachedBufferOverflow(t *testing.T) {
	a := newTestAgent(t, func(c *Config) { c.outputLimit = 4096 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sctx, scancel := context.WithCancel(ctx)
	const total = 100000
	st, _ := a.attach(t, sctx, "big", &sbxv1.ExecRequest{Shell: fmt.Sprintf("sleep 0.2; head -c %d /dev/zero | tr '\\0' a; printf END", total-3)})
	a.detach(t, st, scancel, "big")
	a.waitExited(t, "big")
	st, att := a.attach(t, ctx, "big", nil)
	out, ex := readToExit(t, st)
	if got, want := len(out), a.srv.outputLimit; got != want {
		t.Errorf("buffered output: got %d bytes, want %d", got, want)
	}
	if !strings.HasSuffix(out, "aEND") {
		t.Errorf("buffered output: got ...%q, want the newest bytes (ending in END)", out[max(0, len(out)-10):])
	}
	if got, want := att.GetDroppedStdout(), uint64(total-a.srv.outputLimit); got != want {
		t.Errorf("dropped: got %d, want %d", got, want)
	}
	if ex.GetExitCode() != 0 {
		t.Errorf("exit code: got %d, want 0", ex.GetExitCode())
	}
}

func TestDetachedAttachedOutputIsNotDropped(t *testing.T) {
	a := newTestAgent(t, func(c *Config) { c.outputLimit = 4096 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, _ := a.attach(t, ctx, "live", &sbxv1.ExecRequest{Shell: "head -c 1000000 /dev/zero"})
	out, ex := readToExit(t, st)
	if len(out) != 1000000 || ex.GetExitCode() != 0 {
		t.Errorf("attached output: got %d bytes exit %d, want 1000000 bytes, exit 0", len(out), ex.GetExitCode())
	}
}

func TestDetachedRemoveKillsGroup(t *testing.T) {
	a := newTestAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, att := a.attach(t, ctx, "grp", &sbxv1.ExecRequest{Shell: "sleep 1000 & echo bg=$!; wait"})
	out, _ := readUntil(t, st, "\n")
	bg, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(out, "bg=")))
	if err != nil {
		t.Fatalf("background pid from %q: %v", out, err)
	}
	if _, err := a.conn.RemoveDetached(ctx, connect.NewRequest(&agentv1.RemoveDetachedRequest{Id: "grp"})); err != nil {
		t.Fatalf("RemoveDetached: %v", err)
	}
	for _, pid := range []int{int(att.GetPid()), bg} {
		waitGone(t, pid)
	}
	if _, err := st.Receive(); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("attached stream after remove: got %v, want NotFound", err)
	}
	if _, err := a.conn.RemoveDetached(ctx, connect.NewRequest(&agentv1.RemoveDetachedRequest{Id: "grp"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("second remove: got %v, want NotFound", err)
	}
}

func TestDetachedSignalAndTakeOver(t *testing.T) {
	a := newTestAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st1, _ := a.attach(t, ctx, "sig", &sbxv1.ExecRequest{Shell: "echo up; sleep 1000"})
	readUntil(t, st1, "up")
	st2, _ := a.attach(t, ctx, "sig", nil)
	if _, err := st1.Receive(); connect.CodeOf(err) != connect.CodeAborted {
		t.Errorf("first stream after take-over: got %v, want Aborted", err)
	}
	if err := st2.Send(&agentv1.AttachInput{Event: &agentv1.AttachInput_Input{Input: &sbxv1.ExecInput{Event: &sbxv1.ExecInput_Signal{Signal: 15}}}}); err != nil {
		t.Fatal(err)
	}
	_, ex := readToExit(t, st2)
	if ex.GetSignal() != 15 {
		t.Errorf("after SIGTERM: got %v, want signal 15", ex)
	}
}

func TestDetachedBadRequests(t *testing.T) {
	a := newTestAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a.attach(t, ctx, "taken", &sbxv1.ExecRequest{Shell: "sleep 1000"})
	t.Cleanup(func() {
		a.conn.RemoveDetached(context.Background(), connect.NewRequest(&agentv1.RemoveDetachedRequest{Id: "taken"}))
	})
	tests := []struct {
		name string
		id   string
		req  *sbxv1.ExecRequest
		want connect.Code
	}{
		{"empty id", "", &sbxv1.ExecRequest{Shell: "true"}, connect.CodeInvalidArgument},
		{"bad id", "a/b", &sbxv1.ExecRequest{Shell: "true"}, connect.CodeInvalidArgument},
		{"long id", strings.Repeat("x", 129), nil, connect.CodeInvalidArgument},
		{"unknown", "nope", nil, connect.CodeNotFound},
		{"in use", "taken", &sbxv1.ExecRequest{Shell: "true"}, connect.CodeAlreadyExists},
		{"timeout", "t", &sbxv1.ExecRequest{Shell: "true", TimeoutMs: 5}, connect.CodeInvalidArgument},
		{"no command", "t", &sbxv1.ExecRequest{}, connect.CodeInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := a.tryAttach(ctx, tt.id, tt.req)
			if got := connect.CodeOf(err); got != tt.want {
				t.Errorf("got %v, want %v", err, tt.want)
			}
		})
	}
	// A command that cannot start gets only an exited event.
	st := a.conn.Attach(ctx)
	st.Send(&agentv1.AttachInput{Event: &agentv1.AttachInput_Start{Start: &agentv1.AttachStart{Id: "nf", Exec: &sbxv1.ExecRequest{Argv: []string{"/no/such/cmd"}}}}})
	msg, err := st.Receive()
	if err != nil || msg.GetOutput().GetExited().GetExitCode() != 127 {
		t.Errorf("missing command: got %v, %v, want an exited event with code 127", msg, err)
	}
	if p := a.listDetached(t)["nf"]; p != nil {
		t.Errorf("a command that did not start is listed: %v", p)
	}
}

func unixKill0(pid int) error { return unix.Kill(pid, 0) }

// waitGone waits until pid no longer runs (gone or a zombie).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		if f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])); len(f) > 0 && (f[0] == "Z" || f[0] == "X") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("process %d still runs", pid)
}

// BenchmarkShellRoundTrip measures one line written to a long-lived shell
// and its echo read back (a session command's floor) through an Attach
// stream of a detached process, against the baseline of an Exec stream
// with stdin open (what sessions used before detached processes).
func BenchmarkShellRoundTrip(b *testing.B) {
	const loop = `while read l; do echo "$l"; done`
	b.Run("exec-baseline", func(b *testing.B) {
		a := newTestAgent(b)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		st := a.conn.Exec(ctx)
		if err := st.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Start{Start: &sbxv1.ExecRequest{Shell: loop, StdinOpen: true}}}); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for b.Loop() {
			if err := st.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Stdin{Stdin: []byte("x\n")}}); err != nil {
				b.Fatal(err)
			}
			for {
				msg, err := st.Receive()
				if err != nil {
					b.Fatal(err)
				}
				if len(msg.GetStdout()) > 0 {
					break
				}
			}
		}
	})
	b.Run("attach", func(b *testing.B) {
		a := newTestAgent(b)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		st, _, err := a.tryAttach(ctx, "bench", &sbxv1.ExecRequest{Shell: loop, StdinOpen: true})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			a.conn.RemoveDetached(context.Background(), connect.NewRequest(&agentv1.RemoveDetachedRequest{Id: "bench"}))
		})
		b.ResetTimer()
		for b.Loop() {
			if err := st.Send(stdin("x\n")); err != nil {
				b.Fatal(err)
			}
			for {
				msg, err := st.Receive()
				if err != nil {
					b.Fatal(err)
				}
				if len(msg.GetOutput().GetStdout()) > 0 {
					break
				}
			}
		}
	})
}

// TestDetachedStartsOwned: a process started by Attach is owned by its
// client from the start, so output it writes before the client's serve runs
// is back-pressured, not dropped (a race CI once hit: 4096 of 1 MB lost).
func TestDetachedStartsOwned(t *testing.T) {
	a := newTestAgent(t)
	d, err := a.srv.startDetached("owned", &sbxv1.ExecRequest{Shell: "head -c 1000000 /dev/zero"})
	if err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	owner, gen := d.owner, d.gen
	d.mu.Unlock()
	if owner == 0 || owner != gen {
		t.Errorf("a started process: owner %d, generation %d; want it owned by its starter", owner, gen)
	}
	if _, err := a.conn.RemoveDetached(context.Background(), connect.NewRequest(&agentv1.RemoveDetachedRequest{Id: "owned"})); err != nil {
		t.Fatal(err)
	}
}
