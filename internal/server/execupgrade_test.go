package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sbxdev/sbx/api/execframe"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/fake"
	"github.com/sbxdev/sbx/internal/sandbox"
	"github.com/sbxdev/sbx/internal/store"
	"github.com/sbxdev/sbx/internal/testutil"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// execEnv is a daemon's front over the fake driver (real agent processes,
// no isolation) and a real store, served by an httptest server that speaks
// HTTP/1.1 and cleartext HTTP/2 as the daemon does.
type execEnv struct {
	t     *testing.T
	mgr   *sandbox.Manager
	front atomic.Pointer[Front]
	srv   *httptest.Server
	sb    string // a running sandbox's id
	// stateDir is the fake driver's: one directory per box.
	stateDir string
	conns    atomic.Int32
	execs    atomic.Int32 // GET /exec requests
}

const execTestToken = "exec-test-token"

// newExecEnv starts the front; wrap, if given, wraps its handler.
func newExecEnv(t *testing.T, wrap func(http.Handler) http.Handler) *execEnv {
	t.Helper()
	return newExecEnvDriver(t, wrap, nil)
}

// newExecEnvDriver is newExecEnv whose fake driver is wrapped by
// wrapDriver, if given.
func newExecEnvDriver(t *testing.T, wrap func(http.Handler) http.Handler, wrapDriver func(*fake.Driver) runtime.Driver) *execEnv {
	t.Helper()
	return newExecEnvConfig(t, wrap, wrapDriver, 0)
}

// newExecEnvConfig is newExecEnvDriver whose manager speaks at most agent
// protocol agentProtocol (0: all it can).
func newExecEnvConfig(t *testing.T, wrap func(http.Handler) http.Handler, wrapDriver func(*fake.Driver) runtime.Driver, agentProtocol uint32) *execEnv {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(dir, "fake")
	drv, err := fake.New(fake.Config{StateDir: stateDir, AgentPath: testutil.AgentBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	var d runtime.Driver = drv
	if wrapDriver != nil {
		d = wrapDriver(drv)
	}
	mgr, err := sandbox.New(sandbox.Config{
		Store: st, Drivers: map[string]runtime.Driver{"fake": d}, DefaultRuntime: "fake",
		Defaults: runtime.Resources{MemoryBytes: 64 << 20, CPUMillis: 500, Pids: 64, DiskBytes: 16 << 20},
		Limits: sandbox.Limits{
			MinMemoryBytes: 16 << 20, MaxMemoryBytes: 8 << 30, MinCPUMillis: 10, MaxCPUMillis: 2000,
			MinPids: 16, MaxPids: 1 << 20, MinDiskBytes: 1 << 20, MaxDiskBytes: 1 << 40, MaxTimeoutMs: 3600_000,
		},
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		AgentProtocol: agentProtocol,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := mgr.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	mgr.Run()
	e := &execEnv{t: t, mgr: mgr, stateDir: stateDir}
	e.front.Store(newTestFront(mgr))
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { e.front.Load().ServeHTTP(w, r) })
	if wrap != nil {
		h = wrap(h)
	}
	e.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == ExecPath {
			e.execs.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	e.srv.Config.Protocols = &protos
	e.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			e.conns.Add(1)
		}
	}
	e.srv.Start()
	sb, err := mgr.Create(context.Background(), &sbxv1.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	e.sb = sb.Id
	t.Cleanup(func() {
		e.front.Load().Close()
		e.srv.Close()
		list, _ := mgr.List(context.Background(), nil)
		for _, sb := range list {
			_ = mgr.Destroy(context.Background(), sb.Id)
		}
		mgr.Close()
		st.Close()
	})
	return e
}

func newTestFront(mgr *sandbox.Manager) *Front {
	return NewFront(New(mgr).Handler(), mgr, FrontConfig{Token: execTestToken, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
}

// client returns an SDK client of the front (with the token, unless opts
// set another) and a handle on the env's sandbox.
func (e *execEnv) client(t *testing.T, opts ...sbx.Option) (*sbx.Client, *sbx.Sandbox) {
	c := sbx.NewClient(e.srv.URL, append([]sbx.Option{sbx.WithToken(execTestToken)}, opts...)...)
	t.Cleanup(c.Close)
	return c, c.Sandbox(e.sb)
}

// rawConn is a hand-made client of the exec upgrade.
type rawConn struct {
	nc net.Conn
	r  *execframe.Reader
	w  *execframe.Writer
}

// upgrade opens a connection and sends GET path with the given headers,
// returning the connection once it answers 101, or the status.
func (e *execEnv) upgrade(method, path string, header map[string]string) (*rawConn, int) {
	e.t.Helper()
	nc, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		e.t.Fatal(err)
	}
	req := method + " " + path + " HTTP/1.1\r\nHost: sbx\r\n"
	for k, v := range header {
		req += k + ": " + v + "\r\n"
	}
	if _, err := io.WriteString(nc, req+"\r\n"); err != nil {
		e.t.Fatal(err)
	}
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		nc.Close()
		return nil, resp.StatusCode
	}
	c := &rawConn{nc: nc, r: execframe.NewReader(br), w: execframe.NewWriter(nc)}
	e.t.Cleanup(func() { nc.Close() })
	return c, resp.StatusCode
}

var upgradeHeaders = map[string]string{"Connection": "Upgrade", "Upgrade": ExecUpgrade, "Authorization": "Bearer " + execTestToken}

func (e *execEnv) dial() *rawConn {
	e.t.Helper()
	c, status := e.upgrade("GET", ExecPath, upgradeHeaders)
	if c == nil {
		e.t.Fatalf("upgrade: status %d", status)
	}
	return c
}

func (c *rawConn) sendStart(t *testing.T, req *sbxv1.ExecRequest) {
	t.Helper()
	c.sendFrame(t, execframe.FrameInput, &sbxv1.ExecInput{Event: &sbxv1.ExecInput_Start{Start: req}})
}

func (c *rawConn) sendFrame(t *testing.T, typ byte, m *sbxv1.ExecInput) {
	t.Helper()
	if err := c.w.Write(typ, m); err != nil {
		t.Fatal(err)
	}
	if err := c.w.Flush(); err != nil {
		t.Fatal(err)
	}
}

// result reads a command's frames: its stdout and exit code, or the error
// frame.
func (c *rawConn) result(t *testing.T) (stdout string, code int32, ferr *execframe.Error) {
	t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	var out strings.Builder
	for {
		m, err := c.r.ReadOutput()
		if errors.As(err, &ferr) {
			return out.String(), -1, ferr
		}
		if err != nil {
			t.Fatalf("reading output: %v", err)
		}
		out.Write(m.GetStdout())
		if x := m.GetExited(); x != nil {
			return out.String(), x.GetExitCode(), nil
		}
	}
}

// closedByDaemon reports whether the daemon closed c within a while
// (frames it sent before are skipped).
func (c *rawConn) closedByDaemon() bool {
	_ = c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		if _, _, err := c.r.Next(); err != nil {
			return !errors.Is(err, os.ErrDeadlineExceeded)
		}
	}
}

func TestExecUpgradeRefusals(t *testing.T) {
	e := newExecEnv(t, nil)
	tests := []struct {
		name   string
		method string
		header map[string]string
		want   int
	}{
		{"no token", "GET", map[string]string{"Connection": "Upgrade", "Upgrade": ExecUpgrade}, http.StatusUnauthorized},
		{"wrong token", "GET", map[string]string{"Connection": "Upgrade", "Upgrade": ExecUpgrade, "Authorization": "Bearer nope"}, http.StatusUnauthorized},
		{"not an upgrade", "GET", map[string]string{"Authorization": "Bearer " + execTestToken}, http.StatusBadRequest},
		{"other protocol", "GET", map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Authorization": "Bearer " + execTestToken}, http.StatusBadRequest},
		{"POST", "POST", upgradeHeaders, http.StatusBadRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if c, status := e.upgrade(tc.method, ExecPath, tc.header); c != nil || status != tc.want {
				t.Errorf("got status %d, want %d", status, tc.want)
			}
		})
	}
}

// TestExecUpgradeCommands: one connection runs command after command, and
// a refused command leaves it usable.
func TestExecUpgradeCommands(t *testing.T) {
	e := newExecEnv(t, nil)
	c := e.dial()
	for i, tc := range []struct {
		req      *sbxv1.ExecRequest
		wantOut  string
		wantCode int32
		wantErr  connect.Code
	}{
		{req: &sbxv1.ExecRequest{Sandbox: e.sb, Shell: "echo one"}, wantOut: "one\n"},
		{req: &sbxv1.ExecRequest{Sandbox: e.sb, Shell: "exit 3"}, wantCode: 3},
		{req: &sbxv1.ExecRequest{Sandbox: e.sb, Shell: "tr a-z A-Z", Stdin: []byte("up front")}, wantOut: "UP FRONT"},
		{req: &sbxv1.ExecRequest{Sandbox: e.sb}, wantErr: connect.CodeInvalidArgument},
		{req: &sbxv1.ExecRequest{Sandbox: e.sb, Argv: []string{"true"}, TimeoutMs: -1}, wantErr: connect.CodeInvalidArgument},
		{req: &sbxv1.ExecRequest{Sandbox: e.sb, Argv: []string{"cat"}, StdinOpen: true}, wantErr: connect.CodeInvalidArgument},
		{req: &sbxv1.ExecRequest{Sandbox: "no-such-box", Argv: []string{"true"}}, wantErr: connect.CodeNotFound},
		{req: &sbxv1.ExecRequest{Sandbox: e.sb, Argv: []string{"/no/such/binary"}}, wantCode: 127},
		// Refused by the agent, over its framed socket.
		{req: &sbxv1.ExecRequest{Sandbox: e.sb, Argv: []string{"true"}, User: "nosuchuser"}, wantErr: connect.CodeInvalidArgument},
		{req: &sbxv1.ExecRequest{Sandbox: e.sb, Argv: []string{"sh", "-c", "echo two"}}, wantOut: "two\n"},
	} {
		c.sendStart(t, tc.req)
		out, code, ferr := c.result(t)
		switch {
		case tc.wantErr != 0:
			if ferr == nil || connect.Code(ferr.Code) != tc.wantErr || ferr.Message == "" {
				t.Errorf("command %d: got %v (exit %d), want a %v error", i, ferr, code, tc.wantErr)
			} else if strings.HasPrefix(ferr.Message, tc.wantErr.String()) {
				t.Errorf("command %d: message %q repeats its code", i, ferr.Message)
			}
		case ferr != nil || out != tc.wantOut || code != tc.wantCode:
			t.Errorf("command %d: got %q, exit %d, %v; want %q, exit %d", i, out, code, ferr, tc.wantOut, tc.wantCode)
		}
	}
	if n := e.conns.Load(); n != 1 {
		t.Errorf("%d connections, want 1", n)
	}
}

// TestExecUpgradeProtocolErrors: frames that are not a command's start
// get one error frame, then the daemon hangs up.
func TestExecUpgradeProtocolErrors(t *testing.T) {
	e := newExecEnv(t, nil)
	t.Run("output frame", func(t *testing.T) {
		c := e.dial()
		c.sendFrame(t, execframe.FrameOutput, &sbxv1.ExecInput{})
		if _, _, ferr := c.result(t); ferr == nil || connect.Code(ferr.Code) != connect.CodeInvalidArgument {
			t.Errorf("got %v, want an invalid_argument error frame", ferr)
		}
		if !c.closedByDaemon() {
			t.Error("the connection stayed open")
		}
	})
	t.Run("input that is not start", func(t *testing.T) {
		c := e.dial()
		c.sendFrame(t, execframe.FrameInput, &sbxv1.ExecInput{Event: &sbxv1.ExecInput_StdinClose{StdinClose: true}})
		if _, _, ferr := c.result(t); ferr == nil || !strings.Contains(ferr.Message, "start") {
			t.Errorf("got %v, want an error naming the start message", ferr)
		}
		if !c.closedByDaemon() {
			t.Error("the connection stayed open")
		}
	})
	t.Run("not protobuf", func(t *testing.T) {
		c := e.dial()
		if _, err := c.nc.Write([]byte{execframe.FrameInput, 0, 0, 0, 3, 0xff, 0xff, 0xff}); err != nil {
			t.Fatal(err)
		}
		if _, _, ferr := c.result(t); ferr == nil || connect.Code(ferr.Code) != connect.CodeInvalidArgument {
			t.Errorf("got %v, want an invalid_argument error frame", ferr)
		}
		if !c.closedByDaemon() {
			t.Error("the connection stayed open")
		}
	})
	t.Run("oversized frame", func(t *testing.T) {
		c := e.dial()
		if _, err := c.nc.Write([]byte{execframe.FrameInput, 0xff, 0xff, 0xff, 0xff}); err != nil {
			t.Fatal(err)
		}
		if !c.closedByDaemon() {
			t.Error("the connection stayed open")
		}
	})
}

// running starts a command that writes its pid to a file and sleeps, and
// returns the pid once it runs.
func (e *execEnv) running(t *testing.T, c *rawConn) int {
	t.Helper()
	pidFile := filepath.Join(t.TempDir(), "pid")
	if err := os.Chmod(filepath.Dir(pidFile), 0o777); err != nil {
		t.Fatal(err)
	}
	c.sendStart(t, &sbxv1.ExecRequest{Sandbox: e.sb, Shell: "echo $$ > " + pidFile + "; exec sleep 300"})
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := os.ReadFile(pidFile)
		if err == nil && strings.HasSuffix(string(b), "\n") {
			var pid int
			for _, ch := range strings.TrimSpace(string(b)) {
				pid = pid*10 + int(ch-'0')
			}
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatal("the command did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitGone waits for pid to be gone (reaped by the agent).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join("/proc", itoa(pid))); errors.Is(err, os.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d outlived its cancelled command", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// TestExecUpgradeCancel: the client closing the connection, or sending
// anything in the middle of a command, kills the command.
func TestExecUpgradeCancel(t *testing.T) {
	e := newExecEnv(t, nil)
	t.Run("close", func(t *testing.T) {
		c := e.dial()
		pid := e.running(t, c)
		c.nc.Close()
		waitGone(t, pid)
	})
	t.Run("frame mid-command", func(t *testing.T) {
		c := e.dial()
		pid := e.running(t, c)
		c.sendStart(t, &sbxv1.ExecRequest{Sandbox: e.sb, Argv: []string{"true"}})
		waitGone(t, pid)
		if !c.closedByDaemon() {
			t.Error("the connection stayed open")
		}
	})
	t.Run("daemon stops", func(t *testing.T) {
		c := e.dial()
		pid := e.running(t, c)
		e.front.Load().Close()
		waitGone(t, pid)
		if !c.closedByDaemon() {
			t.Error("the connection stayed open")
		}
	})
}

// TestExecConnIdle: a connection that waits too long between commands is
// closed.
func TestExecConnIdle(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	done := make(chan struct{})
	go func() {
		serveExecConn(context.Background(), nil, a, bufio.NewReader(a), 50*time.Millisecond)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("an idle connection was not closed")
	}
	if _, err := b.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("read after idle close: %v, want EOF", err)
	}
}

// TestSDKExecUpgrade: the Go SDK runs Exec over pooled upgraded
// connections, and still works where the upgrade is refused or turned off.
func TestSDKExecUpgrade(t *testing.T) {
	ctx := context.Background()
	t.Run("pooled", func(t *testing.T) {
		e := newExecEnv(t, nil)
		c, sb := e.client(t)
		conns := e.conns.Load()
		for i := range 5 {
			res, err := sb.RunShell(ctx, "echo hi; echo err >&2; exit 4")
			if err != nil {
				t.Fatal(err)
			}
			if string(res.Stdout) != "hi\n" || string(res.Stderr) != "err\n" || res.Code != 4 {
				t.Errorf("run %d: got %q %q exit %d", i, res.Stdout, res.Stderr, res.Code)
			}
		}
		if _, err := c.Sandbox("no-such-box").Run(ctx, "true"); !sbx.IsNotFound(err) {
			t.Errorf("unknown sandbox: got %v, want not found", err)
		}
		if res, err := sb.Run(ctx, "true"); err != nil || res.Code != 0 {
			t.Errorf("after an error: %v, %v", res, err)
		}
		if n := e.conns.Load() - conns; n != 1 {
			t.Errorf("7 execs (one refused) opened %d connections, want 1", n)
		}
		if n := e.execs.Load(); n != 1 {
			t.Errorf("%d upgrades, want 1", n)
		}
	})
	t.Run("concurrent", func(t *testing.T) {
		e := newExecEnv(t, nil)
		_, sb := e.client(t)
		errs := make(chan error, 8)
		for g := range 8 {
			go func() {
				for i := range 5 {
					want := fmt.Sprintf("%d.%d\n", g, i)
					res, err := sb.Run(ctx, "echo", strings.TrimSpace(want))
					if err == nil && string(res.Stdout) != want {
						err = fmt.Errorf("got %q, want %q", res.Stdout, want)
					}
					if err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
		}
		for range 8 {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
		if n := e.execs.Load(); n > 8 {
			t.Errorf("%d upgrades for 8 concurrent callers", n)
		}
	})
	t.Run("cancel", func(t *testing.T) {
		e := newExecEnv(t, nil)
		_, sb := e.client(t)
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err := sb.RunShell(cctx, "exec sleep 321")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want the deadline", err)
		}
		// The command is gone with its connection, which is not reused.
		deadline := time.Now().Add(20 * time.Second)
		for {
			res, err := sb.RunShell(ctx, "pgrep -f 'sleep 32[1]' || true")
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimSpace(string(res.Stdout)) == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the command outlived its client: %q", res.Stdout)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	t.Run("daemon closed the idle connection", func(t *testing.T) {
		e := newExecEnv(t, nil)
		_, sb := e.client(t)
		if _, err := sb.Run(ctx, "true"); err != nil {
			t.Fatal(err)
		}
		e.front.Swap(newTestFront(e.mgr)).Close() // closes the upgraded connections, not the server
		time.Sleep(50 * time.Millisecond)
		if res, err := sb.Run(ctx, "echo", "again"); err != nil || string(res.Stdout) != "again\n" {
			t.Fatalf("exec after the daemon dropped the pooled connection: %v, %v", res, err)
		}
		if n := e.execs.Load(); n != 2 {
			t.Errorf("%d upgrades, want 2", n)
		}
	})
	t.Run("refused", func(t *testing.T) {
		// A daemon (or proxy) without the upgrade: 404, as an older daemon's
		// API mux answers.
		e := newExecEnv(t, func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == ExecPath {
					http.NotFound(w, r)
					return
				}
				h.ServeHTTP(w, r)
			})
		})
		_, sb := e.client(t)
		for range 3 {
			if res, err := sb.Run(ctx, "echo", "rpc"); err != nil || string(res.Stdout) != "rpc\n" {
				t.Fatalf("got %v, %v", res, err)
			}
		}
		if n := e.execs.Load(); n != 1 {
			t.Errorf("%d upgrade attempts, want 1 (then the RPC only)", n)
		}
	})
	t.Run("turned off", func(t *testing.T) {
		e := newExecEnv(t, nil)
		_, sb := e.client(t, sbx.WithoutExecUpgrade())
		if res, err := sb.Run(ctx, "echo", "rpc"); err != nil || string(res.Stdout) != "rpc\n" {
			t.Fatalf("got %v, %v", res, err)
		}
		if n := e.execs.Load(); n != 0 {
			t.Errorf("%d upgrades, want none", n)
		}
	})
	t.Run("bad token", func(t *testing.T) {
		e := newExecEnv(t, nil)
		_, sb := e.client(t, sbx.WithToken("wrong"))
		for range 2 {
			_, err := sb.Run(ctx, "true")
			var se *sbx.Error
			if !errors.As(err, &se) || se.Code != connect.CodeUnauthenticated {
				t.Fatalf("got %v, want unauthenticated", err)
			}
		}
		// Not taken for a daemon without the upgrade: both runs tried it.
		if n := e.execs.Load(); n != 2 {
			t.Errorf("%d upgrade attempts, want 2", n)
		}
	})
}
