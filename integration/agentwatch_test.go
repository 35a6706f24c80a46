package integration

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// boxInit is the host pid of sandbox id's init (its agent), from the oci
// driver's state.
func boxInit(t *testing.T, d *daemon, id string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(d.dataDir, "oci", "boxes", id, "init.pid"))
	if err != nil {
		t.Fatalf("init pid of %s: %v", id, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		t.Fatalf("init pid of %s: %q", id, b)
	}
	return pid
}

// killInit SIGKILLs sandbox id's init from the host and waits until it has
// exited (gone, or a zombie).
func killInit(t *testing.T, d *daemon, id string) {
	t.Helper()
	pid := boxInit(t, d, id)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill init %d of %s: %v", pid, id, err)
	}
	waitExited(t, pid, "init of "+id)
}

// waitFailed waits (bounded) until sb is no longer running and checks it is
// failed with a detail containing every one of want, in GetSandbox and in
// `sbx inspect` and `sbx ls`.
func waitFailed(t *testing.T, ctx context.Context, d *daemon, sb *sbx.Sandbox, want ...string) {
	t.Helper()
	var got *sbx.Sandbox
	deadline := time.Now().Add(5 * time.Second)
	for {
		var err error
		if got, err = d.client().Get(ctx, sb.ID); err != nil {
			t.Fatalf("get %s: %v", sb.ID, err)
		}
		if got.Info.GetState() != sbxv1.SandboxState_SANDBOX_STATE_RUNNING || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st := got.Info.GetState(); st != sbxv1.SandboxState_SANDBOX_STATE_FAILED {
		t.Fatalf("state of %s 5s after its init died: %v (%q), want failed", sb.ID, st, got.Info.GetStateDetail())
	}
	for _, w := range want {
		if !strings.Contains(got.Info.GetStateDetail(), w) {
			t.Errorf("state detail of %s: %q, want it to name %q", sb.ID, got.Info.GetStateDetail(), w)
		}
	}
	out, stderr, code := d.cli("", "inspect", sb.ID)
	if code != 0 || !strings.Contains(out, want[0]) {
		t.Errorf("sbx inspect %s: exit %d, out %q, stderr %q; want it to name %q", sb.ID, code, out, stderr, want[0])
	}
	out, stderr, code = d.cli("", "ls")
	if code != 0 || !strings.Contains(out, "failed") {
		t.Errorf("sbx ls: exit %d, out %q, stderr %q; want %s shown failed", code, out, stderr, sb.ID)
	}
}

// execFailsFast checks an exec on sb fails at once, FailedPrecondition,
// naming want.
func execFailsFast(t *testing.T, sb *sbx.Sandbox, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	res, err := sb.Run(ctx, "true")
	took := time.Since(start)
	if err == nil {
		t.Fatalf("exec on %s whose agent is dead: got %v, want an error", sb.ID, res)
	}
	if !sbx.IsFailedPrecondition(err) || !strings.Contains(err.Error(), want) {
		t.Errorf("exec on %s whose agent is dead: got %v, want FailedPrecondition naming %q", sb.ID, err, want)
	}
	if took > 2*time.Second {
		t.Errorf("exec on %s whose agent is dead took %v to fail, want at once", sb.ID, took)
	}
}

// gvisorSandboxPid is the host pid of gvisor sandbox id's runsc sandbox
// process (the sentry, which ends with the box's agent), from `runsc state`.
func gvisorSandboxPid(t *testing.T, d *daemon, runsc, id string) int {
	t.Helper()
	out, err := exec.Command(runsc, "--root", filepath.Join(d.dataDir, "gvisor", "runsc"), "state", id).Output()
	if err != nil {
		t.Fatalf("runsc state %s: %v", id, err)
	}
	var st struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 1 {
		t.Fatalf("runsc state %s: %q (%v), want a pid", id, out, err)
	}
	return st.Pid
}

// waitExited waits until pid has exited (gone, or a zombie).
func waitExited(t *testing.T, pid int, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if i := strings.LastIndexByte(string(b), ')'); err != nil || (i > 0 && i+2 < len(b) && b[i+2] == 'Z') {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s (pid %d) still alive 10s after SIGKILL", what, pid)
}

// TestAgentDeathNoticed: the box's agent (its init) is SIGKILLed, as its own
// memory reserve running out or a bug would end it: from the host for an
// oci box; for a gvisor box, whose agent lives in gVisor's kernel, with
// `runsc kill` (the agent alone) and by killing its runsc sandbox process
// from the host. The sandbox must not stay "running": it turns failed
// within a bounded wait, its detail naming the signal (GetSandbox, `sbx
// inspect`, `sbx ls`), an exec fails at once with FailedPrecondition naming
// it, a neighbour is served throughout, and destroy leaves nothing behind
// (no zombie in the daemon either). The same when the agent dies while the
// daemon is down: the restarted daemon marks the box failed instead of
// re-attaching or silently dropping it.
func TestAgentDeathNoticed(t *testing.T) {
	type kill struct {
		name string
		do   func(t *testing.T, d *daemon, id string)
		want []string
	}
	for _, tc := range []struct {
		name  string
		args  func(t *testing.T) []string
		opts  sbx.CreateOptions
		kills []kill
	}{{
		name:  "oci",
		args:  func(*testing.T) []string { return nil },
		kills: []kill{{"init from the host", killInit, []string{"killed by signal SIGKILL", "agent died"}}},
	}, {
		name: "gvisor",
		args: func(t *testing.T) []string { return []string{"--runsc", runscForTests(t)} },
		opts: sbx.CreateOptions{Runtime: "gvisor"},
		kills: []kill{{"agent with runsc kill", func(t *testing.T, d *daemon, id string) {
			runsc := runscForTests(t)
			pid := gvisorSandboxPid(t, d, runsc, id)
			if out, err := exec.Command(runsc, "--root", filepath.Join(d.dataDir, "gvisor", "runsc"), "kill", id, "KILL").CombinedOutput(); err != nil {
				t.Fatalf("runsc kill %s KILL: %v: %s", id, err, out)
			}
			waitExited(t, pid, "runsc sandbox of "+id)
		}, []string{"killed by signal SIGKILL", "agent died"}}, {"sandbox process from the host", func(t *testing.T, d *daemon, id string) {
			pid := gvisorSandboxPid(t, d, runscForTests(t), id)
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatalf("kill runsc sandbox %d of %s: %v", pid, id, err)
			}
			waitExited(t, pid, "runsc sandbox of "+id)
		}, []string{"died with its gVisor sandbox process, killed by signal SIGKILL", "agent died"}}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			d := startDaemon(t, tc.args(t)...)
			ctx := ctxT(t, 3*time.Minute)
			neighbour := newBox(t, ctx, d, tc.opts)
			for _, k := range tc.kills {
				sb := newBox(t, ctx, d, tc.opts)
				execWorks(t, sb, "before the kill")
				k.do(t, d, sb.ID)
				waitFailed(t, ctx, d, sb, k.want...)
				execFailsFast(t, sb, "SIGKILL")
				stillServes(t, ctx, d, neighbour, "neighbour of a box whose agent died ("+k.name+")")
				if err := sb.Destroy(ctx); err != nil {
					t.Fatalf("destroy %s: %v", sb.ID, err)
				}
				d.assertNoLeaks(neighbour.ID)
			}

			down := newBox(t, ctx, d, tc.opts)
			execWorks(t, down, "before the restart")
			d.stop()
			tc.kills[0].do(t, d, down.ID)
			d.start()
			waitFailed(t, ctx, d, down, "while the daemon was down")
			execFailsFast(t, down, "while the daemon was down")
			stillServes(t, ctx, d, neighbour, "neighbour after the restart")
			if err := down.Destroy(ctx); err != nil {
				t.Fatalf("destroy %s: %v", down.ID, err)
			}
			d.assertNoLeaks(neighbour.ID)
		})
	}
}
