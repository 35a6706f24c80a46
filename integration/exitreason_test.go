package integration

import (
	"strings"
	"testing"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestExitReasonsPerExec: an exec is told it was OOM-killed only for an OOM
// kill during its own life. A child OOM-killed inside an exec that still
// exits 0 used to leave the sandbox's count unread, and the next plain
// `kill -9` was then reported as an OOM kill. A fork refused by the pids
// limit is reported on the failed exec during which it happened, and not
// on the next one.
func TestExitReasonsPerExec(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	sb := newBox(t, ctx, d, sbx.CreateOptions{MemoryBytes: 64 << 20, DiskBytes: 16 << 20, Pids: 64})

	// A child is OOM-killed; the shell goes on and exits 0.
	res, err := sb.RunShell(ctx, "python3 -c 'b = bytearray(256 << 20)'; echo child=$?")
	if err != nil {
		t.Fatal(err)
	}
	if res.Code != 0 || res.OOMKilled || !strings.Contains(string(res.Stdout), "child=137") {
		t.Fatalf("shell around an OOM-killed child: exit %d, oom_killed %v, out %q; want 0, false, child=137", res.Code, res.OOMKilled, res.Stdout)
	}
	res, err = sb.RunShell(ctx, "kill -9 $$")
	if err != nil {
		t.Fatal(err)
	}
	if res.Code != 137 || res.OOMKilled {
		t.Errorf("kill -9 after an earlier OOM kill: exit %d, oom_killed %v; want 137 and false", res.Code, res.OOMKilled)
	}
	res, err = sb.RunShell(ctx, "python3 -c 'b = bytearray(256 << 20)'")
	if err != nil {
		t.Fatal(err)
	}
	if res.Code != 137 || !res.OOMKilled {
		t.Errorf("memory hog: exit %d, oom_killed %v; want 137 and true", res.Code, res.OOMKilled)
	}

	// Fork until the pids limit refuses, then let the children go.
	forker := `import os, signal, sys, time
kids, refused = [], False
try:
    while True:
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        kids.append(pid)
except OSError as e:
    print("refused", e.errno, "after", len(kids))
    refused = True
for k in kids:
    os.kill(k, signal.SIGKILL)
    os.waitpid(k, 0)
sys.exit(3 if refused else 0)
`
	res, err = sb.Run(ctx, "python3", "-c", forker)
	if err != nil {
		t.Fatal(err)
	}
	if res.Code != 3 || !res.PidsLimitHit || !strings.Contains(string(res.Stdout), "refused 11") {
		t.Errorf("forking past the pids limit: exit %d, pids_limit_hit %v, out %q; want 3, true, refused 11 (EAGAIN)", res.Code, res.PidsLimitHit, res.Stdout)
	}
	res, err = sb.RunShell(ctx, "exit 1")
	if err != nil || res.PidsLimitHit || res.OOMKilled {
		t.Errorf("failing exec afterwards: %+v %v; want no limit reported", res, err)
	}
	_, errOut, code := d.cli("", "exec", sb.ID, "--", "python3", "-c", forker)
	if code != 3 || !strings.Contains(errOut, "pids limit refused a fork") {
		t.Errorf("sbx exec of the forker: exit %d, stderr %q; want the pids limit named", code, errOut)
	}
}
