package integration

import (
	"bytes"
	"context"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// processOutput returns what process p has kept of its stdout (not
// following).
func processOutput(t *testing.T, ctx context.Context, p *sbx.BackgroundProcess) string {
	t.Helper()
	var out bytes.Buffer
	if _, err := p.Connect(ctx, sbx.ConnectOptions{Stdout: &out}); err != nil {
		t.Fatalf("connect to process %d: %v", p.PID, err)
	}
	return out.String()
}

// waitOutput waits until process p's kept stdout contains want.
func waitOutput(t *testing.T, ctx context.Context, p *sbx.BackgroundProcess, want string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		out := processOutput(t, ctx, p)
		if strings.Contains(out, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d: output %q has no %q after 15s", p.PID, out, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBackgroundProcessSurvivesClientAndDaemon starts a background process
// with the CLI (`exec -d -i`, whose client then exits), feeds it stdin from
// another client, restarts the daemon twice (kill -9, then a graceful
// stop) and checks after each that ps still lists it running under the
// same pid and that stdin still reaches it; attach then replays everything
// it printed, forwards the rest of stdin and exits with its exit code, and
// proc wait reports it.
func TestBackgroundProcessSurvivesClientAndDaemon(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	c := d.client()
	sb, err := c.Create(ctx, sbx.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)

	out, errs, code := d.cli("", "exec", "-d", "-i", "--tag", "echoer", sb.ID, "--",
		"sh", "-c", `echo started; while read l; do echo "got $l"; [ "$l" = three ] && exit 3; done; echo eof`)
	if code != 0 {
		t.Fatalf("exec -d: exit %d, stderr %q", code, errs)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil || pid <= 1 {
		t.Fatalf("exec -d printed %q, want a pid", out)
	}
	p, err := sb.Process(ctx, "echoer")
	if err != nil {
		t.Fatalf("process by tag: %v", err)
	}
	if p.PID != pid || !p.Running || !p.StdinOpen {
		t.Fatalf("process by tag: got %+v, want pid %d running with stdin open", p, pid)
	}
	if err := p.SendStdin(ctx, []byte("one\n")); err != nil {
		t.Fatalf("send stdin: %v", err)
	}
	waitOutput(t, ctx, p, "got one\n")

	for i, restart := range []func(){d.kill9, d.stop} {
		restart()
		d.start()
		out, errs, code := d.cli("", "ps", sb.ID)
		if code != 0 || !strings.Contains(out, strconv.Itoa(pid)) || !strings.Contains(out, "running") || !strings.Contains(out, "echoer") {
			t.Fatalf("restart %d: ps: exit %d, stdout %q, stderr %q; want pid %d running, tagged echoer", i, code, out, errs, pid)
		}
		p, err := d.client().Sandbox(sb.ID).Process(ctx, strconv.Itoa(pid))
		if err != nil {
			t.Fatalf("restart %d: process by pid: %v", i, err)
		}
		if err := p.SendStdin(ctx, []byte("two\n")); err != nil {
			t.Fatalf("restart %d: send stdin: %v", i, err)
		}
		waitOutput(t, ctx, p, strings.Repeat("got two\n", i+1))
	}

	out, errs, code = d.cli("three\n", "attach", "--close-stdin", sb.ID, strconv.Itoa(pid))
	if want := "started\ngot one\ngot two\ngot two\ngot three\n"; out != want || code != 3 {
		t.Fatalf("attach: got stdout %q, exit %d (stderr %q); want %q, exit 3", out, code, errs, want)
	}
	out, errs, code = d.cli("", "proc", "wait", sb.ID, "echoer")
	if strings.TrimSpace(out) != "3" || code != 0 {
		t.Fatalf("proc wait: got %q, exit %d (stderr %q); want 3", out, code, errs)
	}
	// Removed, it is gone from ps.
	if _, errs, code := d.cli("", "proc", "rm", sb.ID, strconv.Itoa(pid)); code != 0 {
		t.Fatalf("proc rm: exit %d, stderr %q", code, errs)
	}
	if out, _, _ := d.cli("", "ps", "-q", sb.ID); strings.TrimSpace(out) != "" {
		t.Fatalf("ps after rm: got %q, want nothing", out)
	}
}

// TestBackgroundProcessSignalsLimitsTTY: kill -s TERM ends a process with
// signal 15 for every waiter; the sandbox's running background processes
// are bounded (--exec-max-background), the excess refused with
// ResourceExhausted naming the flag, and a slot frees when one ends; the
// output ring keeps the newest bytes and counts the rest; a process under
// a terminal takes input after its start.
func TestBackgroundProcessSignalsLimitsTTY(t *testing.T) {
	d := startDaemon(t, "--exec-max-background", "2")
	ctx := ctxT(t, 3*time.Minute)
	c := d.client()
	sb, err := c.Create(ctx, sbx.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)

	sleeper := func() (*sbx.BackgroundProcess, error) {
		return sb.StartBackground(ctx, sbx.BackgroundOptions{Argv: []string{"sleep", "600"}})
	}
	p1, err := sleeper()
	if err != nil {
		t.Fatal(err)
	}
	tty, err := sb.StartBackground(ctx, sbx.BackgroundOptions{Shell: "exec sh -i", TTY: true, Rows: 30, Cols: 100, Tag: "term"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = sleeper()
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "--exec-max-background") {
		t.Fatalf("third background process: got %v, want ResourceExhausted naming --exec-max-background", err)
	}

	// The terminal takes input after its start, and its size.
	if err := tty.SendStdin(ctx, []byte("stty size; echo $((6*7))\n")); err != nil {
		t.Fatalf("tty stdin: %v", err)
	}
	waitOutput(t, ctx, tty, "42")
	if out := processOutput(t, ctx, tty); !strings.Contains(out, "30 100") {
		t.Fatalf("tty output %q: want the size 30 100", out)
	}
	if err := tty.Resize(ctx, 40, 120); err != nil {
		t.Fatalf("resize: %v", err)
	}
	if err := tty.SendStdin(ctx, []byte("stty size\n")); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, ctx, tty, "40 120")
	if err := tty.SendStdin(ctx, []byte("exit 5\n")); err != nil {
		t.Fatal(err)
	}
	if st, err := tty.Wait(ctx); err != nil || st.Code != 5 {
		t.Fatalf("tty wait: got %+v, %v; want exit 5", st, err)
	}

	// Two waiters, one of them a CLI, see the TERM.
	waited := make(chan *sbx.ExitStatus, 1)
	go func() {
		st, err := p1.Wait(ctx)
		if err != nil {
			t.Error(err)
		}
		waited <- st
	}()
	if _, errs, code := d.cli("", "kill", "-s", "TERM", sb.ID, strconv.Itoa(p1.PID)); code != 0 {
		t.Fatalf("kill: exit %d, stderr %q", code, errs)
	}
	if st := <-waited; st == nil || st.Signal != 15 || st.Code != 143 {
		t.Fatalf("wait after kill -s TERM: got %+v, want signal 15, code 143", st)
	}

	// Both slots are free again: the ring of a chatty process keeps its
	// newest 256 KiB.
	big, err := sb.StartBackground(ctx, sbx.BackgroundOptions{Shell: "head -c 1000000 /dev/zero | tr '\\0' x; echo END"})
	if err != nil {
		t.Fatalf("a process after the others ended: %v", err)
	}
	if _, err := big.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	var dropped uint64
	st, err := big.Connect(ctx, sbx.ConnectOptions{Stdout: &out, OnDropped: func(o, _ uint64) { dropped += o }})
	if err != nil || st == nil || st.Code != 0 {
		t.Fatalf("connect: %+v, %v; want the exit 0", st, err)
	}
	if !strings.HasSuffix(out.String(), "xEND\n") || out.Len() > 256<<10 || dropped+uint64(out.Len()) != 1000004 {
		t.Fatalf("kept %d bytes, dropped %d: want at most %d kept ending xEND, 1000004 in all", out.Len(), dropped, 256<<10)
	}
	if _, err := sleeper(); err != nil {
		t.Fatalf("a second process: %v", err)
	}
}

// TestForegroundExecKilledWithItsClient: a foreground `sbx exec` (the
// exec upgrade path) and `sbx exec -i` (ExecInteractive) whose CLI is
// SIGKILLed take their command with them within 5 s, every time: nothing
// runs on unseen. Each is tried 8 times: before, `exec -i`'s command
// often outlived its client until the agent's next keepalive (10 s), as
// the daemon's side of the agent stream stayed open after the client went
// away and its HTTP/2 transport did not see the cancellation.
func TestForegroundExecKilledWithItsClient(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 5*time.Minute)
	sb, err := d.client().Create(ctx, sbx.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	running := func(marker string) string {
		return strings.TrimSpace(mustRun(t, ctx, sb, "pgrep -f 'sleep "+marker+"$' | wc -l"))
	}
	for i := range 16 {
		var flags []string
		if i%2 == 1 {
			flags = []string{"-i"}
		}
		marker := strconv.Itoa(5000 + i)
		args := append(append([]string{"--addr", d.url(), "exec"}, flags...), sb.ID, "--", "sh", "-c", "echo ready; exec sleep "+marker)
		cmd := exec.Command(d.bin, args...)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdin, err := cmd.StdinPipe() // left open: the client never ends its stdin
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 6)
		if _, err := io.ReadFull(stdout, buf); err != nil || string(buf) != "ready\n" {
			t.Fatalf("exec %v: read %q, %v; want ready", flags, buf, err)
		}
		if n := running(marker); n != "1" {
			t.Fatalf("exec %v: %s commands running, want 1", flags, n)
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
		stdin.Close()
		deadline := time.Now().Add(5 * time.Second)
		for running(marker) != "0" {
			if time.Now().After(deadline) {
				t.Fatalf("exec %v (try %d): the command outlived its killed client by 5s", flags, i/2+1)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// agentRSS is the sandbox agent's (PID 1's) resident memory in KiB.
func agentRSS(t *testing.T, ctx context.Context, sb *sbx.Sandbox) int {
	t.Helper()
	f := strings.Fields(mustRun(t, ctx, sb, "grep ^VmRSS: /proc/1/status"))
	if len(f) < 2 {
		t.Fatalf("no VmRSS for PID 1: %q", f)
	}
	kb, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatal(err)
	}
	return kb
}

// TestBackgroundOutputFloodBoundsAgentMemory (attack class 5): box code
// in the most background processes allowed fills every output ring
// nobody reads. The rings live in the agent's memory, in its reserve
// beside user code (at most 32 MiB), so all of them together stay within
// a shared budget and the agent's GC has a soft limit: PID 1 grows by less
// than 20 MiB (measured: 13.7 MiB; 56.7 MiB with rings of 2 × 256 KiB each
// and no budget, 71 MiB without the soft limit either), the box still
// execs and the daemon lists them.
func TestBackgroundOutputFloodBoundsAgentMemory(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	sb, err := d.client().Create(ctx, sbx.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	warm, err := sb.StartBackground(ctx, sbx.BackgroundOptions{Shell: "echo warm"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := warm.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := warm.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	before := agentRSS(t, ctx, sb)
	const n = 64 // --exec-max-background's default
	for i := range n {
		if _, err := sb.StartBackground(ctx, sbx.BackgroundOptions{
			Shell: "head -c 1048576 /dev/zero; head -c 1048576 /dev/zero >&2; exec sleep 600",
		}); err != nil {
			t.Fatalf("process %d: %v", i, err)
		}
	}
	// Every ring has dropped output of both streams: each is full.
	deadline := time.Now().Add(60 * time.Second)
	for {
		list, err := sb.Processes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		full := 0
		for _, p := range list {
			if p.DroppedStdout > 0 && p.DroppedStderr > 0 {
				full++
			}
		}
		if full == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d rings full after 60s", full, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	after := agentRSS(t, ctx, sb)
	t.Logf("agent RSS %d KiB before, %d KiB with %d full rings", before, after, n)
	if grew := after - before; grew > 20<<10 {
		t.Fatalf("the agent grew by %d KiB with %d full rings, want under %d KiB", grew, n, 20<<10)
	}
}

// TestProcessCallsCountAsRunningCommands (attack class 4): every process
// call holds a goroutine and an agent stream in the daemon (a stdin write
// up to 5 s), so they count against --exec-max-streams like execs: with
// the two allowed held by followers, a stdin write and a list are refused
// with ResourceExhausted naming the flag, and served again once a
// follower lets go.
func TestProcessCallsCountAsRunningCommands(t *testing.T) {
	d := startDaemon(t, "--exec-max-streams", "2")
	ctx := ctxT(t, 2*time.Minute)
	sb, err := d.client().Create(ctx, sbx.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	p, err := sb.StartBackground(ctx, sbx.BackgroundOptions{Shell: "echo x; exec sleep 600", StdinOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	// Two followers take both slots: each holds its slot once it has been
	// sent the replayed "x" (they stream until cancelled).
	cancels := make([]context.CancelFunc, 2)
	for i := range cancels {
		fctx, cancel := context.WithCancel(ctx)
		cancels[i] = cancel
		defer cancel()
		held := make(chan struct{})
		var once sync.Once
		go func() {
			_, err := p.Connect(fctx, sbx.ConnectOptions{Follow: true, Stdout: writerFunc(func(b []byte) (int, error) {
				once.Do(func() { close(held) })
				return len(b), nil
			})})
			if fctx.Err() == nil {
				t.Errorf("follower %d ended early: %v", i, err)
				once.Do(func() { close(held) })
			}
		}()
		<-held
	}
	if err := p.SendStdin(ctx, []byte("x")); connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "--exec-max-streams") {
		t.Fatalf("stdin with both slots held: got %v, want ResourceExhausted naming --exec-max-streams", err)
	}
	if _, err := sb.Processes(ctx); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("list with both slots held: got %v, want ResourceExhausted", err)
	}
	cancels[0]()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err := sb.Processes(ctx); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("after a follower let go: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancels[1]()
}

// writerFunc is an io.Writer of a function.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }
