package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/agentconn"
)

// framedAgent serves framed execs on a Unix socket; its client takes that
// path for ExecOnce.
func framedAgent(t *testing.T) *agentconn.Conn {
	t.Helper()
	return agentconn.New(noAPIDial(t), agentconn.WithExecDial(framedAgentSocket(t)))
}

// noAPIDial fails the test if the agent's API socket is dialled.
func noAPIDial(t *testing.T) agentconn.DialFunc {
	return func(context.Context) (net.Conn, error) {
		t.Error("the API socket was dialled")
		return nil, os.ErrInvalid
	}
}

// framedAgentSocket serves framed execs on a Unix socket and returns its
// dialer.
func framedAgentSocket(t *testing.T) agentconn.DialFunc {
	t.Helper()
	dir := t.TempDir()
	srv, err := NewServer(Config{Env: []string{"PATH=/usr/bin:/bin"}, Workdir: dir, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return serveSocket(t, filepath.Join(dir, "exec.sock"), "ServeExec", srv.ServeExec)
}

// collectFramed runs start to the end of its stream.
func collectFramed(t *testing.T, conn *agentconn.Conn, start *sbxv1.ExecRequest) (res execResult, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := conn.ExecOnce(ctx, start)
	if err != nil {
		return res, err
	}
	defer st.Close()
	for st.Receive() {
		switch ev := st.Msg().GetEvent().(type) {
		case *sbxv1.ExecOutput_Started:
			res.pid = ev.Started.GetPid()
		case *sbxv1.ExecOutput_Stdout:
			res.stdout += string(ev.Stdout)
		case *sbxv1.ExecOutput_Stderr:
			res.stderr += string(ev.Stderr)
		case *sbxv1.ExecOutput_Exited:
			res.exited = ev.Exited
		}
	}
	return res, st.Err()
}

func TestFramedExec(t *testing.T) {
	conn := framedAgent(t)
	tests := []struct {
		name                   string
		req                    *sbxv1.ExecRequest
		stdout, stderr         string
		code                   int32
		started                bool
		wantErr                connect.Code
		wantErrText, wantError string
	}{
		{name: "output and exit code", req: &sbxv1.ExecRequest{Shell: "echo out; echo err >&2; exit 3"}, stdout: "out\n", stderr: "err\n", code: 3, started: true},
		{name: "stdin up front", req: &sbxv1.ExecRequest{Argv: []string{"tr", "a-z", "A-Z"}, Stdin: []byte("hello")}, stdout: "HELLO", started: true},
		{name: "env and tty", req: &sbxv1.ExecRequest{Shell: `[ -t 1 ] && echo "tty $X"`, Env: map[string]string{"X": "y"}, Tty: true}, stdout: "tty y\r\n", started: true},
		{name: "timeout", req: &sbxv1.ExecRequest{Argv: []string{"sleep", "30"}, TimeoutMs: 100}, code: 137, started: true},
		{name: "not found", req: &sbxv1.ExecRequest{Argv: []string{"no-such-command-x"}}, code: 127, wantError: "command not found"},
		{name: "no command", req: &sbxv1.ExecRequest{}, wantErr: connect.CodeInvalidArgument, wantErrText: "one of argv and shell"},
		{name: "unknown user", req: &sbxv1.ExecRequest{Argv: []string{"true"}, User: "nobody-here"}, wantErr: connect.CodeInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := collectFramed(t, conn, tc.req)
			if tc.wantErr != 0 {
				if connect.CodeOf(err) != tc.wantErr || !strings.Contains(err.Error(), tc.wantErrText) {
					t.Fatalf("got error %v, want %v containing %q", err, tc.wantErr, tc.wantErrText)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.stdout != tc.stdout || res.stderr != tc.stderr || res.exited.GetExitCode() != tc.code || (res.pid != 0) != tc.started {
				t.Errorf("got stdout %q stderr %q exit %d pid %d, want %q %q %d (started %v)", res.stdout, res.stderr, res.exited.GetExitCode(), res.pid, tc.stdout, tc.stderr, tc.code, tc.started)
			}
			if !strings.Contains(res.exited.GetError(), tc.wantError) {
				t.Errorf("exited error %q, want it to contain %q", res.exited.GetError(), tc.wantError)
			}
		})
	}
}

// Dropping the connection (the daemon's client went away) kills the command.
func TestFramedExecCancelKills(t *testing.T) {
	conn := framedAgent(t)
	ctx, cancel := context.WithCancel(context.Background())
	st, err := conn.ExecOnce(ctx, &sbxv1.ExecRequest{Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() || st.Msg().GetStarted() == nil {
		t.Fatalf("want started first, got %v (%v)", st.Msg(), st.Err())
	}
	pid := int(st.Msg().GetStarted().GetPid())
	cancel()
	if st.Receive() {
		t.Errorf("a message after cancel: %v", st.Msg())
	}
	if connect.CodeOf(st.Err()) != connect.CodeCanceled {
		t.Errorf("after cancel: got %v, want canceled", st.Err())
	}
	st.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil || strings.Contains(string(b), ") Z ") {
			break // gone (or a zombie the agent is about to reap)
		}
		if time.Now().After(deadline) {
			t.Fatalf("sleep (pid %d) outlived its connection", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A box without an exec socket still runs commands: this agent (protocol
// 5) takes them framed on its API endpoint; an older one gets the Exec RPC
// (agentconn's TestOldAgentGetsExecRPC).
func TestFramedExecFallsBackToRPC(t *testing.T) {
	a := newTestAgent(t)
	conn := agentconn.New(a.dial, agentconn.WithExecDial(func(context.Context) (net.Conn, error) {
		return nil, fmt.Errorf("no exec socket: %w", errors.ErrUnsupported)
	}))
	defer conn.Close()
	res, err := collectFramed(t, conn, &sbxv1.ExecRequest{Shell: "echo via rpc"})
	if err != nil || res.stdout != "via rpc\n" {
		t.Fatalf("got %q, %v; want the command's output through the RPC", res.stdout, err)
	}
}

// closeTracked records whether a connection was closed.
type closeTracked struct {
	net.Conn
	closed atomic.Bool
}

func (c *closeTracked) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
}

// A command takes the spare connection dialled after the one before, and
// Close closes the spare and stops the refills.
func TestFramedExecSpareConnection(t *testing.T) {
	dial := framedAgentSocket(t)
	var mu sync.Mutex
	var dialed []*closeTracked
	conn := agentconn.New(noAPIDial(t), agentconn.WithExecDial(func(ctx context.Context) (net.Conn, error) {
		nc, err := dial(ctx)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		dialed = append(dialed, &closeTracked{Conn: nc})
		return dialed[len(dialed)-1], nil
	}))
	dials := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(dialed)
	}
	waitDials := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for dials() != n {
			if time.Now().After(deadline) {
				t.Fatalf("%d dials, want %d", dials(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	ctx := context.Background()
	for i := range 3 {
		st, err := conn.ExecOnce(ctx, &sbxv1.ExecRequest{Argv: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		// The first command dials; later ones take the spare.
		if got := dials(); got != i+1 {
			t.Errorf("command %d: %d dials before it ended, want %d", i, got, i+1)
		}
		for st.Receive() {
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		st.Close()
		waitDials(i + 2) // the spare for the next command
	}
	// Close closes the spare (the fourth connection); a command after it
	// dials, and its end refills nothing.
	conn.Close()
	st, err := conn.ExecOnce(ctx, &sbxv1.ExecRequest{Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	for st.Receive() {
	}
	st.Close()
	time.Sleep(50 * time.Millisecond)
	if got := dials(); got != 5 {
		t.Errorf("%d dials after Close, want 5", got)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, c := range dialed {
		if !c.closed.Load() {
			t.Errorf("connection %d still open after Close", i)
		}
	}
}

// firstByteConn records the first byte the daemon wrote on a connection.
type firstByteConn struct {
	net.Conn
	once  sync.Once
	first *atomic.Int32 // counts connections whose first byte was 'I'
}

func (c *firstByteConn) Write(p []byte) (int, error) {
	if len(p) > 0 {
		c.once.Do(func() {
			if p[0] == 'I' {
				c.first.Add(1)
			}
		})
	}
	return c.Conn.Write(p)
}

// TestFramedExecOnAPIEndpoint: an agent of protocol 5 takes framed execs on
// its API endpoint too, beside the AgentService's HTTP/2, so a driver that
// gives it one endpoint only (no exec socket) still gets the framed
// transport. The daemon asks the agent's protocol (Hello) first if it does
// not know it yet.
func TestFramedExecOnAPIEndpoint(t *testing.T) {
	a := newTestAgent(t)
	var framed atomic.Int32
	conn := agentconn.New(func(ctx context.Context) (net.Conn, error) {
		c, err := a.dial(ctx)
		if err != nil {
			return nil, err
		}
		return &firstByteConn{Conn: c, first: &framed}, nil
	})
	defer conn.Close()
	for i := range 3 {
		want := fmt.Sprintf("framed %d\n", i)
		res, err := collectFramed(t, conn, &sbxv1.ExecRequest{Shell: "echo " + strings.TrimSpace(want) + "; exit 2"})
		if err != nil || res.stdout != want || res.exited.GetExitCode() != 2 {
			t.Fatalf("command %d: got %q exit %d, %v; want %q exit 2", i, res.stdout, res.exited.GetExitCode(), err, want)
		}
		if n := framed.Load(); n < int32(i+1) {
			t.Errorf("after command %d: %d framed connections on the API endpoint, want at least %d", i, n, i+1)
		}
	}
	// The AgentService still answers on the same endpoint.
	hello, err := conn.Hello(context.Background())
	if err != nil {
		t.Fatalf("Hello after framed execs: %v", err)
	}
	if got, want := hello.GetProtocolVersion(), uint32(ProtocolVersion); got != want {
		t.Errorf("Hello: protocol %d, want %d", got, want)
	}
}
