package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sbxdev/sbx/api/gen/agent/v1"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// logsResult is what one Logs stream delivered.
type logsResult struct {
	stdout, stderr   string
	dropOut, dropErr uint64
	exited           *sbxv1.ExecExited
	events           []string // "out", "err", "drop", "exit" in order
}

// readLogs reads a Logs stream to its end; onData, if set, is called after
// each data event with what arrived so far.
func (a *testAgent) readLogs(ctx context.Context, req *sbxv1.LogsRequest, onData func(*logsResult)) (*logsResult, error) {
	st, err := a.conn.Logs(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	defer st.Close()
	r := &logsResult{}
	for st.Receive() {
		switch ev := st.Msg().GetEvent().(type) {
		case *sbxv1.LogsEvent_Data:
			if ev.Data.GetStderr() {
				r.stderr += string(ev.Data.GetData())
				r.events = append(r.events, "err")
			} else {
				r.stdout += string(ev.Data.GetData())
				r.events = append(r.events, "out")
			}
			if onData != nil {
				onData(r)
			}
		case *sbxv1.LogsEvent_Dropped:
			r.dropOut += ev.Dropped.GetStdoutBytes()
			r.dropErr += ev.Dropped.GetStderrBytes()
			r.events = append(r.events, "drop")
		case *sbxv1.LogsEvent_Exited:
			r.exited = ev.Exited
			r.events = append(r.events, "exit")
		}
	}
	return r, st.Err()
}

func (a *testAgent) killEntrypoint(t *testing.T) {
	t.Helper()
	if e := a.srv.entry.Load(); e != nil {
		e.p.kill()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if e.wait(ctx) == nil {
			t.Errorf("entrypoint did not exit after SIGKILL")
		}
	}
}

// TestEntrypointOutputBounded: the sandbox's own command writes into a ring
// of the newest bytes (the rest dropped and counted), not into the agent's
// stdout, which is a file on the host; Logs reads it, Wait gets its status.
func TestEntrypointOutputBounded(t *testing.T) {
	a := newTestAgent(t, func(c *Config) { c.outputLimit = 4096 })
	const total = 1 << 20
	script := fmt.Sprintf("head -c %d /dev/zero | tr '\\0' e; printf LAST; exit 7", total-4)
	if err := a.srv.startEntrypoint([]string{"/bin/sh", "-c", script}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, err := a.conn.Wait(ctx, connect.NewRequest(&sbxv1.WaitRequest{}))
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if got := w.Msg.GetExited().GetExitCode(); got != 7 {
		t.Errorf("Wait: exit code %d, want 7", got)
	}
	r, err := a.readLogs(ctx, &sbxv1.LogsRequest{}, nil)
	if err != nil {
		t.Fatalf("Logs: %v", err)
	}
	if len(r.stdout) != a.srv.outputLimit || !strings.HasSuffix(r.stdout, "eLAST") {
		t.Errorf("entrypoint output: %d bytes, ...%q; want %d ending in eLAST", len(r.stdout), r.stdout[max(0, len(r.stdout)-12):], a.srv.outputLimit)
	}
	if got, want := r.dropOut, uint64(total-a.srv.outputLimit); got != want {
		t.Errorf("dropped: got %d, want %d", got, want)
	}
	if r.exited.GetExitCode() != 7 || r.events[len(r.events)-1] != "exit" {
		t.Errorf("events %v, exited %v: want exited (code 7) last", r.events, r.exited)
	}
	// Reading did not consume anything: a second reader gets the same.
	r2, err := a.readLogs(ctx, &sbxv1.LogsRequest{}, nil)
	if err != nil || r2.stdout != r.stdout || r2.dropOut != r.dropOut {
		t.Errorf("second read: %d bytes, dropped %d, %v; want what the first got", len(r2.stdout), r2.dropOut, err)
	}
	// A new entrypoint may start once the old one has exited, not while it runs.
	if err := a.srv.startEntrypoint([]string{"/bin/sh", "-c", "sleep 30"}); err != nil {
		t.Fatalf("second entrypoint: %v", err)
	}
	t.Cleanup(func() { a.killEntrypoint(t) })
	if err := a.srv.startEntrypoint([]string{"/bin/true"}); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("entrypoint while one runs: %v, want FailedPrecondition", err)
	}
}

// TestEntrypointLogsFollow: two followers at once see both streams as they
// are written; one that goes away does not stop the command; the stream
// ends with the exit, and Wait returns it.
func TestEntrypointLogsFollow(t *testing.T) {
	a := newTestAgent(t)
	dir := t.TempDir()
	gate := filepath.Join(dir, "go")
	script := fmt.Sprintf(`echo out1; echo err1 >&2; while [ ! -e %s ]; do sleep 0.01; done; echo out2; echo err2 >&2; exit 3`, gate)
	if err := a.srv.startEntrypoint([]string{"/bin/sh", "-c", script}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.killEntrypoint(t) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A follower that leaves after the first lines.
	leaveCtx, leave := context.WithCancel(ctx)
	sawFirst := make(chan struct{})
	var once sync.Once
	leaverDone := make(chan error, 1)
	go func() {
		_, err := a.readLogs(leaveCtx, &sbxv1.LogsRequest{Follow: true}, func(r *logsResult) {
			if strings.Contains(r.stdout, "out1") && strings.Contains(r.stderr, "err1") {
				once.Do(func() { close(sawFirst) })
			}
		})
		leaverDone <- err
	}()
	// A follower that stays; it lets the command go on once it saw the
	// first lines while the command still waits.
	var gated sync.Once
	stayer, err := func() (*logsResult, error) {
		return a.readLogs(ctx, &sbxv1.LogsRequest{Follow: true}, func(r *logsResult) {
			if strings.Contains(r.stdout, "out1") && strings.Contains(r.stderr, "err1") {
				gated.Do(func() {
					select {
					case <-sawFirst:
					case <-ctx.Done():
						return
					}
					leave()
					if err := <-leaverDone; connect.CodeOf(err) != connect.CodeCanceled && !errors.Is(err, context.Canceled) {
						t.Errorf("leaving follower: %v, want canceled", err)
					}
					if err := os.WriteFile(gate, nil, 0o644); err != nil {
						t.Error(err)
					}
				})
			}
		})
	}()
	if err != nil {
		t.Fatalf("following: %v", err)
	}
	if stayer.stdout != "out1\nout2\n" || stayer.stderr != "err1\nerr2\n" {
		t.Errorf("follower got stdout %q stderr %q, want out1,out2 and err1,err2", stayer.stdout, stayer.stderr)
	}
	if stayer.exited.GetExitCode() != 3 {
		t.Errorf("follower's exited: %v, want exit code 3", stayer.exited)
	}
	w, err := a.conn.Wait(ctx, connect.NewRequest(&sbxv1.WaitRequest{}))
	if err != nil || w.Msg.GetExited().GetExitCode() != 3 || strings.Join(w.Msg.GetCommand(), " ") != "/bin/sh -c "+script {
		t.Errorf("Wait: %v, %v; want exit code 3 and the command", w, err)
	}
}

// TestEntrypointNone: Logs and Wait of a sandbox without a command say so.
func TestEntrypointNone(t *testing.T) {
	a := newTestAgent(t)
	ctx := context.Background()
	if _, err := a.readLogs(ctx, &sbxv1.LogsRequest{}, nil); connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "no command") {
		t.Errorf("Logs: %v, want FailedPrecondition naming no command", err)
	}
	if _, err := a.conn.Wait(ctx, connect.NewRequest(&sbxv1.WaitRequest{})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("Wait: %v, want FailedPrecondition", err)
	}
}

// TestConfigureCommandCannotStart: Configure with a command that cannot
// start fails naming it, and leaves no entrypoint behind.
func TestConfigureCommandCannotStart(t *testing.T) {
	a := newTestAgent(t)
	for _, tc := range []struct {
		name string
		req  *agentv1.ConfigureRequest
		want string
	}{
		{"missing binary", &agentv1.ConfigureRequest{Command: []string{"no-such-binary-xyz"}}, "no-such-binary-xyz"},
		{"not executable", &agentv1.ConfigureRequest{Command: []string{"/etc/hostname"}}, "/etc/hostname"},
		{"workdir is a file", &agentv1.ConfigureRequest{Command: []string{"true"}, Workdir: "/etc/hostname"}, "/etc/hostname"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := a.configure(t, tc.req)
			if connect.CodeOf(err) != connect.CodeFailedPrecondition && connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Errorf("got %v, want FailedPrecondition or InvalidArgument", err)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want it to name %q", err, tc.want)
			}
			if a.srv.entry.Load() != nil {
				t.Errorf("an entrypoint was recorded")
			}
		})
	}
}
