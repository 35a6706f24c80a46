package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestExecStdinNotHeldByTheDaemon: an Exec RPC's stdin (up to 64 MiB, in
// its start message) stayed in the daemon's memory for as long as the
// command ran, so commands that never read it (sleep) made the daemon hold
// every byte a client sent: 16 such execs of 48 MiB grew it by 1.3 GiB.
// The daemon now lets go of stdin once the agent has it (about 200 MiB).
func TestExecStdinNotHeldByTheDaemon(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	sb := newBox(t, ctx, d, sbx.CreateOptions{MemoryBytes: 3 << 30})
	pid := d.cmd.Process.Pid
	api := sbxv1connect.NewSandboxServiceClient(http.DefaultClient, "http://"+d.addr)
	stdin := make([]byte, 48<<20)
	ectx, cancel := context.WithCancel(ctx)
	defer cancel()
	const execs = 16
	base := vmRSS(t, pid)
	for i := range execs {
		tag := fmt.Sprintf("%d", 1000+i)
		go func() {
			st, err := api.Exec(ectx, connect.NewRequest(&sbxv1.ExecRequest{Sandbox: sb.ID, Argv: []string{"sleep", tag}, Stdin: stdin}))
			if err != nil {
				return
			}
			for st.Receive() {
			}
		}()
		// One at a time: the command runs once the agent has its stdin.
		waitUntil(t, time.Minute, func() bool {
			return strings.Contains(mustRun(t, ctx, sb, "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '"), "sleep "+tag)
		}, func() string { return "exec " + tag + " never started" })
	}
	rss := vmRSS(t, pid)
	t.Logf("daemon RSS: %d MiB before, %d MiB with %d commands holding 48 MiB of unread stdin each", base, rss, execs)
	if rss-base > 400 {
		t.Errorf("daemon RSS grew by %d MiB for %d execs' stdin (%d MiB sent), want at most 400: the agent has it", rss-base, execs, execs*48)
	}
}
