package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// stillServes checks what must hold of a box after an attack from inside
// it: it answers exec, and the API says it runs. (A box the daemon shows as
// running that cannot exec is the bug this guards against.)
func stillServes(t *testing.T, ctx context.Context, d *daemon, sb *sbx.Sandbox, what string) {
	t.Helper()
	execWorks(t, sb, what)
	got, err := d.client().Get(ctx, sb.ID)
	if err != nil {
		t.Fatalf("%s: get %s: %v", what, sb.ID, err)
	}
	if st := got.Info.GetState(); st != sbxv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Errorf("%s: state %v (%q), want running", what, st, got.Info.GetStateDetail())
	}
}

// TestAgentNotTheOOMVictim: user code (box root, the agent's uid) raises
// PID 1's oom_score_adj to 1000, which needs no privilege, then fills the
// box's memory from a process whose own score is 0. On the old code the kernel's OOM killer then chose the
// agent and the box ended while the daemon still showed it running; now user
// code lives in a cgroup of its own under the box's, with the box's memory
// less the agent's reserve, so the OOM killer chooses among user processes
// only. A neighbour box is served throughout.
func TestAgentNotTheOOMVictim(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	neighbour := newBox(t, ctx, d, sbx.CreateOptions{})
	sb := newBox(t, ctx, d, sbx.CreateOptions{MemoryBytes: 128 << 20, DiskBytes: 32 << 20})
	if got := mustRun(t, ctx, sb, "echo 1000 > /proc/1/oom_score_adj; cat /proc/1/oom_score_adj"); got != "1000\n" {
		t.Fatalf("raising PID 1's oom_score_adj: got %q, want 1000 (the attack's premise)", got)
	}
	for i := 0; i < 3; i++ {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		// The filler sets its own score back to 0 (it inherits PID 1's; 0
		// is as low as an unprivileged process may go), so the agent is
		// the OOM killer's first choice wherever the two share a cgroup.
		res, err := sb.RunShell(rctx, `echo 0 > /proc/self/oom_score_adj && exec python3 -c '
a = []
while True:
    a.append(bytearray(8 << 20))
'`)
		cancel()
		if err != nil {
			t.Fatalf("memory fill %d: %v (the agent did not answer)", i, err)
		}
		if res.Code != 137 || !res.OOMKilled {
			t.Errorf("memory fill %d: exit %d, oom_killed %v; want the filler OOM-killed (137, true)", i, res.Code, res.OOMKilled)
		}
		execWorks(t, neighbour, "neighbour during the memory fills")
	}
	if got := mustRun(t, ctx, sb, "cat /proc/1/oom_score_adj"); got != "1000\n" {
		t.Errorf("PID 1's oom_score_adj after: %q, want the agent still PID 1 with 1000", got)
	}
	stillServes(t, ctx, d, sb, "after memory fills with PID 1 at oom_score_adj 1000")
	stillServes(t, ctx, d, neighbour, "neighbour after the memory fills")
}

// TestAgentServesThroughForkBomb: a fork bomb holds the box at its pids
// limit while the box gets a burst of concurrent execs, which make the
// agent start threads. The agent's threads used to count against the same
// limit (an exec stream was once cut mid-frame); now user code's limit is
// the box's less the agent's reserve. Every exec answers in time (a clean
// refusal to fork is an answer), the box execs again once the bomb is
// gone, and a neighbour is served throughout.
func TestAgentServesThroughForkBomb(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	neighbour := newBox(t, ctx, d, sbx.CreateOptions{})
	sb := newBox(t, ctx, d, sbx.CreateOptions{Pids: 64})
	bombCtx, stopBomb := context.WithTimeout(ctx, 60*time.Second)
	defer stopBomb()
	bombDone := make(chan error, 1)
	go func() {
		// bash keeps forking when a fork fails, and every child holds its
		// pid: the box's user pids stay full until timeout kills the
		// whole process group. (A dash fork bomb dies out: dash exits on a
		// failed fork, so the check below sometimes never saw the limit.)
		_, err := sb.RunShell(bombCtx, "timeout -s KILL 20 bash -c 'while :; do sleep 1000 & done' >/dev/null 2>&1; true")
		bombDone <- err
	}()
	// Wait for the bomb to fill the box's user pids (read on the host).
	userPids := func(file string) string {
		paths, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/pids/*", sb.ID, "user", file))
		if len(paths) != 1 {
			t.Fatalf("the user pids cgroup of %s: found %v", sb.ID, paths)
		}
		b, err := os.ReadFile(paths[0])
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	max := userPids("pids.max")
	waitUntil(t, 15*time.Second, func() bool { return userPids("pids.current") == max },
		func() string {
			return fmt.Sprintf("the fork bomb holds %s of the box's %s user pids", userPids("pids.current"), max)
		})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var hung []string
	for i := 0; i < 32; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			_, err := sb.Run(rctx, "true")
			// The agent's answer under the bomb: the command ran, or its
			// fork was refused (EAGAIN). Anything else (a deadline, a
			// stream cut, an agent gone) is no answer.
			if err != nil && (rctx.Err() != nil || !strings.Contains(err.Error(), "resource temporarily unavailable")) {
				mu.Lock()
				hung = append(hung, err.Error())
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(hung) > 0 {
		t.Errorf("%d of 32 execs during the fork bomb got no answer from the agent, e.g. %s", len(hung), hung[0])
	}
	execWorks(t, neighbour, "neighbour during the fork bomb")
	if err := <-bombDone; err != nil {
		t.Errorf("the bomb's own exec: %v", err)
	}
	// The bomb's orphans may hold pids for a while after timeout kills its
	// shell: kill them (kill -1 spares PID 1 and the caller), retrying
	// while a fork is refused.
	deadline := time.Now().Add(20 * time.Second)
	for {
		rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		res, err := sb.RunShell(rctx, "kill -9 -1 2>/dev/null; true")
		cancel()
		if err == nil && res.Code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("box does not exec after the fork bomb: %v %v", res, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	stillServes(t, ctx, d, sb, "after the fork bomb")
	stillServes(t, ctx, d, neighbour, "neighbour after the fork bomb")
}
