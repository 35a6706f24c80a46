package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestExecCancelKillsCommand: a client that goes away in the middle of a
// non-interactive Exec (the daemon's server-stream path to the agent) takes
// its command with it, and stdin given up front still reaches the command.
func TestExecCancelKillsCommand(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	c := d.client()
	sb, err := c.Create(ctx, sbx.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	defer sb.Destroy(context.WithoutCancel(ctx))

	tests := []struct {
		name  string
		shell string
		stdin string
		want  string
	}{
		{name: "output", shell: "echo out; echo err >&2", want: "out\n"},
		{name: "stdin up front", shell: "tr a-z A-Z", stdin: "hello", want: "HELLO"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stream, err := c.API().Exec(ctx, connect.NewRequest(&sbxv1.ExecRequest{Sandbox: sb.ID, Shell: tc.shell, Stdin: []byte(tc.stdin)}))
			if err != nil {
				t.Fatal(err)
			}
			defer stream.Close()
			var stdout strings.Builder
			code := int32(-1)
			for stream.Receive() {
				m := stream.Msg()
				stdout.Write(m.GetStdout())
				if ex := m.GetExited(); ex != nil {
					code = ex.GetExitCode()
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			if got := stdout.String(); got != tc.want || code != 0 {
				t.Errorf("got %q (exit %d), want %q (exit 0)", got, code, tc.want)
			}
		})
	}

	// The marker keeps the pattern from matching the pgrep of the check.
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	_, err = sb.RunShell(cctx, "exec sleep 321")
	// Either side may notice first: the client's own context, or the daemon,
	// which gets the deadline in the request's timeout header.
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("exec with a cancelled client: got err %v, want the deadline", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := mustRun(t, ctx, sb, "pgrep -f 'sleep 32[1]' || true")
		if strings.TrimSpace(out) == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the command outlived its client: pids %q", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
