package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/agentconn"
)

// testAgent is an in-process agent on a Unix socket and a client of it.
type testAgent struct {
	srv     *Server
	conn    *agentconn.Conn
	dial    agentconn.DialFunc
	workdir string
}

// newTestAgent starts a test agent; opts may adjust its Config.
func newTestAgent(t testing.TB, opts ...func(*Config)) *testAgent {
	t.Helper()
	dir := t.TempDir()
	wd := filepath.Join(dir, "work")
	if err := os.MkdirAll(wd, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Env:     []string{"PATH=/usr/local/bin:/usr/bin:/bin", "SBX_TEST=base"},
		Workdir: wd,
		Logger:  slog.New(slog.DiscardHandler),
	}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dial := serveSocket(t, filepath.Join(dir, "agent.sock"), "Serve", srv.Serve)
	conn := agentconn.New(dial)
	t.Cleanup(conn.Close)
	return &testAgent{srv: srv, conn: conn, dial: dial, workdir: wd}
}

// serveSocket runs serve (named what) on a Unix socket at path until the
// test ends, fails the test if it returns an error, and returns a dialer.
func serveSocket(t testing.TB, path, what string, serve func(context.Context, net.Listener) error) agentconn.DialFunc {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("%s: %v", what, err)
		}
	})
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}
}

// execResult is everything one exec produced.
type execResult struct {
	pid    int32
	stdout string
	stderr string
	exited *sbxv1.ExecExited
}

// run executes req to completion, sending extra inputs right after start.
func (a *testAgent) run(t testing.TB, req *sbxv1.ExecRequest, extra ...*sbxv1.ExecInput) execResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream := a.conn.Exec(ctx)
	if err := stream.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Start{Start: req}}); err != nil {
		t.Fatalf("send start: %v", err)
	}
	for _, in := range extra {
		if err := stream.Send(in); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	res, err := collect(stream)
	if err != nil {
		t.Fatalf("exec %v: %v", req, err)
	}
	return res
}

func collect(stream *connect.BidiStreamForClient[sbxv1.ExecInput, sbxv1.ExecOutput]) (execResult, error) {
	var res execResult
	var out, errb bytes.Buffer
	for {
		msg, err := stream.Receive()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return res, err
		}
		switch ev := msg.GetEvent().(type) {
		case *sbxv1.ExecOutput_Started:
			res.pid = ev.Started.GetPid()
		case *sbxv1.ExecOutput_Stdout:
			out.Write(ev.Stdout)
		case *sbxv1.ExecOutput_Stderr:
			errb.Write(ev.Stderr)
		case *sbxv1.ExecOutput_Exited:
			if res.exited != nil {
				return res, errors.New("two exited events")
			}
			res.exited = ev.Exited
		}
	}
	res.stdout, res.stderr = out.String(), errb.String()
	if res.exited == nil {
		return res, errors.New("no exited event")
	}
	return res, nil
}
