package agent

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/agentconn"
	"github.com/sbxdev/sbx/internal/runtime"
)

// startBinary builds sbx-agent and starts it the production way (the
// files every driver hands it, runtime.AgentFiles), plus an entrypoint.
func startBinary(t *testing.T, pidns bool, entrypoint ...string) (*testAgent, *exec.Cmd, *syncBuffer) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the agent")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "sbx-agent")
	build := exec.Command("go", "build", "-o", bin, "../../cmd/sbx-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building agent: %v\n%s", err, out)
	}
	sock := filepath.Join(dir, "agent.sock")
	af, err := runtime.NewAgentFiles(sock, filepath.Join(dir, "exec.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer af.Ready.Close()
	args := append(slices.Clone(runtime.AgentFDArgs), "--")
	cmd := exec.Command(bin, append(args, entrypoint...)...)
	cmd.ExtraFiles = af.Extra
	if pidns {
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	}
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "SBX_FROM_SPEC=yes"}
	logs := new(syncBuffer)
	cmd.Stdout, cmd.Stderr = logs, logs
	err = cmd.Start()
	af.CloseExtra()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	conn := agentconn.New(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	t.Cleanup(conn.Close)
	if err := agentconn.AwaitReady(context.Background(), af.Ready, 10*time.Second); err != nil {
		t.Fatalf("agent not ready: %v\n%s", err, logs.String())
	}
	return &testAgent{conn: conn, workdir: dir}, cmd, logs
}

func TestBinary(t *testing.T) {
	t.Run("subreaper", func(t *testing.T) { testBinary(t, false) })
	t.Run("pid1", func(t *testing.T) {
		requiresRoot(t)
		testBinary(t, true)
	})
}

// requiresRoot skips tests that need (real or namespaced) root.
func requiresRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("requires root")
	}
}

func testBinary(t *testing.T, pidns bool) {
	a, cmd, logs := startBinary(t, pidns, "sh", "-c", "echo entrypoint says hi; exit 3")
	hostPid := cmd.Process.Pid
	ctx0, cancel0 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel0()
	hello, err := a.conn.Hello(ctx0)
	if err != nil {
		t.Fatal(err)
	}
	pid := int(hello.GetPid())
	if pidns && pid != 1 {
		t.Errorf("agent pid in its namespace: got %d, want 1", pid)
	}

	// No signal user code can send stops the agent. As a pid namespace's init
	// (how sandboxes run it) that is every signal; the kernel keeps SIGKILL
	// and SIGSTOP from it. Without a pid namespace nothing can stop those, nor
	// signals 32 to 34, which Go (1.26) can neither catch nor ignore.
	for sig := syscall.Signal(1); sig <= 64; sig++ {
		if !pidns && (sig == syscall.SIGKILL || sig == syscall.SIGSTOP || (sig >= 32 && sig <= 34)) {
			continue
		}
		res := a.run(t, &sbxv1.ExecRequest{Shell: fmt.Sprintf("kill -%d %d", sig, pid)})
		if got := res.exited.GetExitCode(); got != 0 {
			t.Errorf("kill -%d: got exit code %d (%s), want 0", sig, got, res.stderr)
		}
		if _, err := a.conn.Hello(ctx0); err != nil {
			t.Fatalf("agent gone after signal %d (%s): %v", sig, unix.SignalName(sig), err)
		}
	}

	// Environment and workdir come from the agent's own.
	res := a.run(t, &sbxv1.ExecRequest{Shell: `echo "$SBX_FROM_SPEC $HOME $PATH"; pwd`})
	if got, want := res.stdout, "yes /root /usr/bin:/bin\n"+a.workdir+"\n"; got != want {
		t.Errorf("stdout: got %q, want %q", got, want)
	}

	// A user process has exactly fds 0, 1, 2: the listener is not leaked.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream := a.conn.Exec(ctx)
	stream.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Start{Start: &sbxv1.ExecRequest{Argv: []string{"sleep", "10"}, StdinOpen: true}}})
	msg, err := stream.Receive()
	if err != nil {
		t.Fatal(err)
	}
	userPid := int(msg.GetStarted().GetPid())
	if pidns {
		userPid = hostPID(t, userPid, hostPid)
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", userPid))
	if err != nil {
		t.Fatal(err)
	}
	var fds []string
	for _, e := range ents {
		fds = append(fds, e.Name())
	}
	if got, want := strings.Join(fds, " "), "0 1 2"; got != want {
		t.Errorf("fds of a user process: got %q, want %q", got, want)
	}
	stream.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Signal{Signal: 9}})
	if res, err := collect(stream); err != nil || res.exited.GetSignal() != 9 {
		t.Errorf("killing sleep: got %v, %v, want signal 9", res.exited, err)
	}

	// Orphans re-parented to the agent are reaped.
	for range 20 {
		a.run(t, &sbxv1.ExecRequest{Shell: "sleep 0.01 & exit 0"})
	}
	time.Sleep(300 * time.Millisecond)
	if zs := zombieChildren(t, hostPid); len(zs) > 0 {
		t.Errorf("zombie children of the agent: got %v, want none", zs)
	}
	if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("agent died: %v\n%s", err, logs)
	}
	for _, want := range []string{"entrypoint says hi", "entrypoint exited", "exit_code=3"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("agent log: got %q, want it to contain %q", logs, want)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// hostPID finds the host pid of the child of parent whose pid in its own
// namespace is nsPid.
func hostPID(t *testing.T, nsPid, parent int) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		var ppid, nspid string
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "PPid:"); ok {
				ppid = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
				f := strings.Fields(v)
				nspid = f[len(f)-1]
			}
		}
		if ppid == strconv.Itoa(parent) && nspid == strconv.Itoa(nsPid) {
			pid, _ := strconv.Atoi(e.Name())
			return pid
		}
	}
	t.Fatalf("no child of %d with namespace pid %d", parent, nsPid)
	return 0
}
