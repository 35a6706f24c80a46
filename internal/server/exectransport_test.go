package server

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sbxdev/sbx/api/execframe"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/fake"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// countingDriver is the fake driver whose exec connections count the
// frames' bytes the daemon writes on them.
type countingDriver struct {
	*fake.Driver
	written atomic.Int64
}

func (d *countingDriver) DialExec(ctx context.Context, h runtime.Handle) (net.Conn, error) {
	c, err := d.Driver.DialExec(ctx, h)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, n: &d.written}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// TestExecOneTransport: every way a client runs a command (the exec
// upgrade, the Exec RPC, the ExecInteractive RPC with stdin streamed
// after the start) reaches the agent over its framed exec socket, and
// keeps working against a box whose agent has no such socket (an agent
// older than it, recovered after an upgrade of the daemon), through the
// Exec RPC fallback. Output big enough to take many frames (and both
// streams) arrives whole and in order either way.
func TestExecOneTransport(t *testing.T) {
	ctx := context.Background()
	const big = 3 << 20 // ~100 frames of the agent's
	shell := fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x; echo; echo done >&2; exit 5", big)
	wantOut := strings.Repeat("x", big) + "\n"
	paths := []struct {
		name string
		run  func(t *testing.T, e *execEnv) (stdout, stderr string, code int)
	}{
		{"upgrade", func(t *testing.T, e *execEnv) (string, string, int) {
			_, sb := e.client(t)
			res, err := sb.RunShell(ctx, shell)
			if err != nil {
				t.Fatal(err)
			}
			return string(res.Stdout), string(res.Stderr), res.Code
		}},
		{"rpc", func(t *testing.T, e *execEnv) (string, string, int) {
			_, sb := e.client(t, sbx.WithoutExecUpgrade())
			res, err := sb.RunShell(ctx, shell)
			if err != nil {
				t.Fatal(err)
			}
			return string(res.Stdout), string(res.Stderr), res.Code
		}},
		{"interactive", func(t *testing.T, e *execEnv) (string, string, int) {
			_, sb := e.client(t)
			var stdout, stderr bytes.Buffer
			p, err := sb.StartExec(ctx, sbx.ExecOptions{
				Shell:  "cat; " + shell,
				Stdin:  strings.NewReader("from stdin|"),
				Stdout: &stdout, Stderr: &stderr,
			})
			if err != nil {
				t.Fatal(err)
			}
			st, err := p.Wait()
			if err != nil {
				t.Fatal(err)
			}
			out, ok := strings.CutPrefix(stdout.String(), "from stdin|")
			if !ok {
				t.Errorf("stdin did not come back first: got %.40q...", stdout.String())
			}
			return out, stderr.String(), st.Code
		}},
	}
	for _, socket := range []bool{true, false} {
		for _, p := range paths {
			t.Run(fmt.Sprintf("%s-sock-%v", p.name, socket), func(t *testing.T) {
				var drv *countingDriver
				e := newExecEnvDriver(t, nil, func(d *fake.Driver) runtime.Driver {
					drv = &countingDriver{Driver: d}
					return drv
				})
				if !socket {
					// As a box whose agent predates the socket.
					if err := os.Remove(filepath.Join(e.stateDir, e.sb, "exec.sock")); err != nil {
						t.Fatal(err)
					}
				}
				before := drv.written.Load()
				stdout, stderr, code := p.run(t, e)
				if stdout != wantOut || stderr != "done\n" || code != 5 {
					t.Errorf("got %d bytes of stdout (want %d), stderr %q, exit %d; want stderr \"done\\n\", exit 5",
						len(stdout), len(wantOut), stderr, code)
				}
				if got := drv.written.Load() - before; socket && got == 0 {
					t.Errorf("nothing was written on the agent's exec socket: the command took another transport")
				} else if !socket && got != 0 {
					t.Errorf("%d bytes written on an exec socket that does not exist", got)
				}
			})
		}
	}
}

// oneEndpointDriver is the fake driver as a driver that gives the agent a
// single endpoint: no ExecDialer, and its API connections record whether
// their first byte started a framed exec.
type oneEndpointDriver struct {
	runtime.Driver
	framed atomic.Int64
}

func (d *oneEndpointDriver) Dial(ctx context.Context, h runtime.Handle) (net.Conn, error) {
	c, err := d.Driver.Dial(ctx, h)
	if err != nil {
		return nil, err
	}
	return &firstByteConn{Conn: c, framed: &d.framed}, nil
}

type firstByteConn struct {
	net.Conn
	once   sync.Once
	framed *atomic.Int64
}

func (c *firstByteConn) Write(p []byte) (int, error) {
	if len(p) > 0 {
		c.once.Do(func() {
			if p[0] == execframe.FrameInput {
				c.framed.Add(1)
			}
		})
	}
	return c.Conn.Write(p)
}

// TestExecOneEndpoint: for a driver that gives the agent one endpoint
// (no exec socket), every exec path reaches the agent (protocol 5) with
// framed connections on that endpoint, next to the AgentService.
func TestExecOneEndpoint(t *testing.T) {
	ctx := context.Background()
	var drv *oneEndpointDriver
	e := newExecEnvDriver(t, nil, func(d *fake.Driver) runtime.Driver {
		drv = &oneEndpointDriver{Driver: d}
		return drv
	})
	if _, ok := runtime.Driver(drv).(runtime.ExecDialer); ok {
		t.Fatal("the test driver has an ExecDialer")
	}
	_, sb := e.client(t)
	_, rpc := e.client(t, sbx.WithoutExecUpgrade())
	var stdout bytes.Buffer
	runs := []func() (int, error){
		func() (int, error) { res, err := sb.RunShell(ctx, "echo one; exit 3"); return codeOf(res, err) },
		func() (int, error) { res, err := rpc.RunShell(ctx, "echo one; exit 3"); return codeOf(res, err) },
		func() (int, error) {
			stdout.Reset()
			p, err := sb.StartExec(ctx, sbx.ExecOptions{Shell: "cat; exit 3", Stdin: strings.NewReader("one\n"), Stdout: &stdout})
			if err != nil {
				return 0, err
			}
			st, err := p.Wait()
			if err == nil && stdout.String() != "one\n" {
				err = fmt.Errorf("stdout %q, want \"one\\n\"", stdout.String())
			}
			if err != nil {
				return 0, err
			}
			return st.Code, nil
		},
	}
	for i, run := range runs {
		before := drv.framed.Load()
		code, err := run()
		if err != nil || code != 3 {
			t.Fatalf("path %d: exit %d, %v; want exit 3", i, code, err)
		}
		if drv.framed.Load() == before {
			t.Errorf("path %d: no framed connection on the agent's endpoint", i)
		}
	}
}

func codeOf(res *sbx.Result, err error) (int, error) {
	if err != nil {
		return 0, err
	}
	return res.Code, nil
}
