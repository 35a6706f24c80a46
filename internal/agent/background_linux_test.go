package agent

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	agentv1 "github.com/sbxdev/sbx/api/gen/agent/v1"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

func (a *testAgent) startBG(t *testing.T, id string, req *sbxv1.ExecRequest) *agentv1.DetachedProcess {
	t.Helper()
	resp, err := a.conn.StartProcess(context.Background(), connect.NewRequest(&agentv1.StartProcessRequest{Id: id, Exec: req, Tag: "t-" + id}))
	if err != nil {
		t.Fatalf("start process %s: %v", id, err)
	}
	return resp.Msg.GetProcess()
}

// bgLogs reads background process id's output (following if follow) and
// returns stdout, stderr, the dropped bytes counted and the exit if sent.
func (a *testAgent) bgLogs(t *testing.T, ctx context.Context, id string, follow bool) (string, string, [2]uint64, *sbxv1.ExecExited) {
	t.Helper()
	st, err := a.conn.ProcessLogs(ctx, connect.NewRequest(&agentv1.ProcessLogsRequest{Id: id, Logs: &sbxv1.LogsRequest{Follow: follow}}))
	if err != nil {
		t.Fatalf("process logs %s: %v", id, err)
	}
	defer st.Close()
	var out, errb bytes.Buffer
	var dropped [2]uint64
	var exit *sbxv1.ExecExited
	for st.Receive() {
		switch ev := st.Msg().GetEvent().(type) {
		case *sbxv1.LogsEvent_Data:
			if ev.Data.GetStderr() {
				errb.Write(ev.Data.GetData())
			} else {
				out.Write(ev.Data.GetData())
			}
		case *sbxv1.LogsEvent_Dropped:
			dropped[0] += ev.Dropped.GetStdoutBytes()
			dropped[1] += ev.Dropped.GetStderrBytes()
		case *sbxv1.LogsEvent_Exited:
			exit = ev.Exited
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("process logs %s: %v", id, err)
	}
	return out.String(), errb.String(), dropped, exit
}

func (a *testAgent) input(id string, ins ...*sbxv1.ExecInput) error {
	_, err := a.conn.ProcessInput(context.Background(), connect.NewRequest(&agentv1.ProcessInputRequest{Id: id, Inputs: ins}))
	return err
}

func stdinEv(s string) *sbxv1.ExecInput {
	return &sbxv1.ExecInput{Event: &sbxv1.ExecInput_Stdin{Stdin: []byte(s)}}
}

var closeEv = &sbxv1.ExecInput{Event: &sbxv1.ExecInput_StdinClose{StdinClose: true}}

// Output is replayed to every reader, input arrives after the start, and
// every waiter gets the exit status.
func TestBackgroundReplayInputWait(t *testing.T) {
	a := newTestAgent(t)
	info := a.startBG(t, "proc-1", &sbxv1.ExecRequest{Shell: "echo $GREETING; echo oops >&2; cat; echo done", StdinOpen: true,
		Env: map[string]string{"GREETING": "hello"}, Workdir: "/"})
	if info.GetPid() <= 0 || !info.GetBackground() || !info.GetStdinOpen() || info.GetTag() != "t-proc-1" ||
		info.GetEnv()["GREETING"] != "hello" || info.GetWorkdir() != "/" {
		t.Fatalf("started: got %v, want pid, background, stdin_open, tag, env and workdir", info)
	}
	if err := a.input("proc-1", stdinEv("from stdin\n"), closeEv); err != nil {
		t.Fatalf("input: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := a.conn.WaitProcess(ctx, connect.NewRequest(&agentv1.WaitProcessRequest{Id: "proc-1"}))
	if err != nil {
		t.Fatalf("wait: %v", err)
	}
	if ex := resp.Msg.GetProcess().GetExit(); ex.GetExitCode() != 0 || !resp.Msg.GetProcess().GetExited() {
		t.Fatalf("wait: got %v, want exited 0", resp.Msg.GetProcess())
	}
	// Two readers, one after the other: the ring is not consumed.
	for i := range 2 {
		out, errs, _, exit := a.bgLogs(t, ctx, "proc-1", true)
		if want := "hello\nfrom stdin\ndone\n"; out != want || errs != "oops\n" || exit == nil {
			t.Fatalf("reader %d: got stdout %q stderr %q exit %v, want %q, %q and the exit", i, out, errs, exit, want, "oops\n")
		}
	}
	// Stdin is closed now.
	err = a.input("proc-1", stdinEv("more"))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("stdin after close: got %v, want FailedPrecondition", err)
	}
}

// A follower sees output as it comes and the exit once the process is
// killed by a signal sent through ProcessInput.
func TestBackgroundFollowAndSignal(t *testing.T) {
	a := newTestAgent(t)
	a.startBG(t, "proc-f", &sbxv1.ExecRequest{Shell: "echo ready; exec sleep 60"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := a.conn.ProcessLogs(ctx, connect.NewRequest(&agentv1.ProcessLogsRequest{Id: "proc-f", Logs: &sbxv1.LogsRequest{Follow: true}}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var out strings.Builder
	for !strings.Contains(out.String(), "ready") && st.Receive() {
		out.Write(st.Msg().GetData().GetData())
	}
	if err := a.input("proc-f", &sbxv1.ExecInput{Event: &sbxv1.ExecInput_Signal{Signal: 15}}); err != nil {
		t.Fatalf("signal: %v", err)
	}
	var exit *sbxv1.ExecExited
	for st.Receive() {
		if ex := st.Msg().GetExited(); ex != nil {
			exit = ex
		}
	}
	if exit.GetSignal() != 15 || exit.GetExitCode() != 143 {
		t.Fatalf("exit: got %v, want signal 15, code 143", exit)
	}
}

// The ring keeps the newest bytes and counts what it dropped.
func TestBackgroundRingDrops(t *testing.T) {
	old := backgroundOutput
	backgroundOutput = 4096
	t.Cleanup(func() { backgroundOutput = old })
	a := newTestAgent(t)
	a.startBG(t, "proc-big", &sbxv1.ExecRequest{Shell: "head -c 100000 /dev/zero | tr '\\0' x; echo END"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Read only once it has exited: a reader that follows takes the bytes
	// before the ring drops them.
	if _, err := a.conn.WaitProcess(ctx, connect.NewRequest(&agentv1.WaitProcessRequest{Id: "proc-big"})); err != nil {
		t.Fatal(err)
	}
	out, _, dropped, exit := a.bgLogs(t, ctx, "proc-big", false)
	if exit == nil || !strings.HasSuffix(out, "xEND\n") || len(out) > 4096 {
		t.Fatalf("got %d bytes ending %q (exit %v), want at most 4096 ending xEND", len(out), out[max(0, len(out)-8):], exit)
	}
	if got, want := dropped[0]+uint64(len(out)), uint64(100004); got != want {
		t.Fatalf("dropped+kept: got %d, want %d", got, want)
	}
}

// Bad requests get clear errors, and the running limit holds.
func TestBackgroundRefusals(t *testing.T) {
	a := newTestAgent(t)
	a.startBG(t, "proc-a", &sbxv1.ExecRequest{Argv: []string{"sleep", "60"}})
	t.Cleanup(func() { a.srv.removeBackground("proc-a") })
	for _, tc := range []struct {
		name string
		req  *agentv1.StartProcessRequest
		code connect.Code
	}{
		{"id in use", &agentv1.StartProcessRequest{Id: "proc-a", Exec: &sbxv1.ExecRequest{Argv: []string{"true"}}}, connect.CodeAlreadyExists},
		{"bad id", &agentv1.StartProcessRequest{Id: "a/b", Exec: &sbxv1.ExecRequest{Argv: []string{"true"}}}, connect.CodeInvalidArgument},
		{"not found", &agentv1.StartProcessRequest{Id: "proc-nf", Exec: &sbxv1.ExecRequest{Argv: []string{"/nonexistent"}}}, connect.CodeFailedPrecondition},
		{"long tag", &agentv1.StartProcessRequest{Id: "proc-t", Tag: strings.Repeat("x", 257), Exec: &sbxv1.ExecRequest{Argv: []string{"true"}}}, connect.CodeInvalidArgument},
		{"limit", &agentv1.StartProcessRequest{Id: "proc-b", MaxRunning: 1, Exec: &sbxv1.ExecRequest{Argv: []string{"true"}}}, connect.CodeResourceExhausted},
	} {
		_, err := a.conn.StartProcess(context.Background(), connect.NewRequest(tc.req))
		if connect.CodeOf(err) != tc.code {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.code)
		}
	}
	// An attach cannot take a background process's id, nor attach to one.
	if _, _, err := a.tryAttach(context.Background(), "proc-a", &sbxv1.ExecRequest{Argv: []string{"true"}}); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Errorf("attach start on a background id: got %v, want AlreadyExists", err)
	}
	if err := a.input("proc-a", stdinEv("x")); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("stdin without stdin_open: got %v, want FailedPrecondition", err)
	}
	if err := a.input("proc-a", &sbxv1.ExecInput{Event: &sbxv1.ExecInput_Signal{Signal: 99}}); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("signal 99: got %v, want InvalidArgument", err)
	}
	if err := a.input("proc-zz", closeEv); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("unknown id: got %v, want NotFound", err)
	}
}

// A process that does not read its stdin makes the write time out instead
// of holding the call forever.
func TestBackgroundStdinNotRead(t *testing.T) {
	a := newTestAgent(t)
	a.startBG(t, "proc-s", &sbxv1.ExecRequest{Argv: []string{"sleep", "60"}, StdinOpen: true})
	t.Cleanup(func() { a.srv.removeBackground("proc-s") })
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := a.conn.ProcessInput(ctx, connect.NewRequest(&agentv1.ProcessInputRequest{Id: "proc-s", Inputs: []*sbxv1.ExecInput{stdinEv(strings.Repeat("x", 1<<20))}}))
	if c := connect.CodeOf(err); c != connect.CodeDeadlineExceeded {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
}

// Exited records are listed, then reaped beyond maxExitedBackground
// (oldest first); RemoveDetached kills and forgets a running one.
func TestBackgroundListReapRemove(t *testing.T) {
	a := newTestAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ids := []string{}
	for i := range maxExitedBackground + 2 {
		id := "proc-x" + string(rune('A'+i/26)) + string(rune('a'+i%26))
		ids = append(ids, id)
		a.startBG(t, id, &sbxv1.ExecRequest{Argv: []string{"true"}})
		if _, err := a.conn.WaitProcess(ctx, connect.NewRequest(&agentv1.WaitProcessRequest{Id: id})); err != nil {
			t.Fatalf("wait %s: %v", id, err)
		}
	}
	a.startBG(t, "proc-run", &sbxv1.ExecRequest{Argv: []string{"sleep", "60"}})
	resp, err := a.conn.ListDetached(ctx, connect.NewRequest(&agentv1.ListDetachedRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, p := range resp.Msg.GetProcesses() {
		got[p.GetId()] = p.GetExited()
	}
	if len(got) != maxExitedBackground+1 {
		t.Errorf("listed %d, want %d exited + 1 running", len(got), maxExitedBackground)
	}
	for _, id := range ids[:2] {
		if _, ok := got[id]; ok {
			t.Errorf("%s: still listed, want reaped (oldest exited)", id)
		}
	}
	if exited, ok := got["proc-run"]; !ok || exited {
		t.Errorf("proc-run: got listed=%v exited=%v, want running", ok, exited)
	}
	if _, err := a.conn.RemoveDetached(ctx, connect.NewRequest(&agentv1.RemoveDetachedRequest{Id: "proc-run"})); err != nil {
		t.Fatalf("remove: %v", err)
	}
	if _, err := a.conn.WaitProcess(ctx, connect.NewRequest(&agentv1.WaitProcessRequest{Id: "proc-run"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("wait after remove: got %v, want NotFound", err)
	}
}

// A timeout kills the process group and is recorded.
func TestBackgroundTimeout(t *testing.T) {
	a := newTestAgent(t)
	a.startBG(t, "proc-to", &sbxv1.ExecRequest{Argv: []string{"sleep", "60"}, TimeoutMs: 100})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := a.conn.WaitProcess(ctx, connect.NewRequest(&agentv1.WaitProcessRequest{Id: "proc-to"}))
	if err != nil {
		t.Fatal(err)
	}
	if ex := resp.Msg.GetProcess().GetExit(); !ex.GetTimedOut() || ex.GetSignal() != 9 {
		t.Fatalf("got %v, want timed out by signal 9", ex)
	}
}

func TestRingLimits(t *testing.T) {
	for _, tc := range []struct {
		n, limit, chunks int
	}{
		{0, 256 << 10, 4096},
		{1, 256 << 10, 4096},
		{8, 256 << 10, 4096},
		{64, 32 << 10, 512},
		{1088, 2 << 10, 32},
	} {
		limit, chunks := ringLimits(tc.n)
		if limit != tc.limit || chunks != tc.chunks {
			t.Errorf("ringLimits(%d): got %d, %d; want %d, %d", tc.n, limit, chunks, tc.limit, tc.chunks)
		}
	}
}

// Starting more background processes shrinks the rings of those kept, so
// that all rings together stay within the budget.
func TestBackgroundRingsShareBudget(t *testing.T) {
	oldOut, oldBudget := backgroundOutput, backgroundBudget
	backgroundOutput, backgroundBudget = 32<<10, 64<<10
	t.Cleanup(func() { backgroundOutput, backgroundBudget = oldOut, oldBudget })
	a := newTestAgent(t)
	a.startBG(t, "proc-chatty", &sbxv1.ExecRequest{Shell: "head -c 40000 /dev/zero; exec sleep 60"})
	t.Cleanup(func() { a.srv.removeBackground("proc-chatty") })
	buffered := func() uint64 {
		d, err := a.srv.lookupBackground("test", "proc-chatty")
		if err != nil {
			t.Fatal(err)
		}
		return a.srv.backgroundInfo(d).GetBufferedBytes()
	}
	deadline := time.Now().Add(10 * time.Second)
	for buffered() != 32<<10 {
		if time.Now().After(deadline) {
			t.Fatalf("the ring holds %d bytes, want %d", buffered(), 32<<10)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, id := range []string{"proc-q1", "proc-q2", "proc-q3"} {
		a.startBG(t, id, &sbxv1.ExecRequest{Argv: []string{"true"}})
	}
	if got, want := buffered(), uint64(64<<10/(2*4)); got != want {
		t.Fatalf("after 3 more processes the ring holds %d bytes, want %d", got, want)
	}
}
