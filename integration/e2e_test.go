package integration

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustRun(t *testing.T, ctx context.Context, sb *sbx.Sandbox, shell string) string {
	t.Helper()
	res, err := sb.RunShell(ctx, shell)
	if err != nil {
		t.Fatalf("exec %q: %v", shell, err)
	}
	if res.Code != 0 {
		t.Fatalf("exec %q: exit %d, stderr %q", shell, res.Code, res.Stderr)
	}
	return string(res.Stdout)
}

func TestLifecycleThroughSDK(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	c := d.client()

	sb, err := c.Create(ctx, sbx.CreateOptions{
		Name: "life", Labels: map[string]string{"team": "a", "tier": "x"},
		Env: map[string]string{"GREETING": "hello"}, Secrets: map[string]string{"TOKEN": "s3cret"},
		Workdir: "/work/here", MemoryBytes: 128 << 20, CPUs: 0.5, Pids: 128, DiskBytes: 64 << 20,
	})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	if got := sb.Info.GetState(); got != sbxv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Errorf("state after create: got %v, want RUNNING", got)
	}
	if got := sb.Info.GetSecretNames(); len(got) != 1 || got[0] != "TOKEN" {
		t.Errorf("secret names: got %v, want [TOKEN]", got)
	}
	if strings.Contains(sb.Info.String(), "s3cret") {
		t.Error("the API returned a secret's value")
	}

	// Env, secrets, workdir and python from the host image.
	out := mustRun(t, ctx, sb, `echo "$GREETING $TOKEN $(pwd)"; python3 -c 'print(6*7)'`)
	if want := "hello s3cret /work/here\n42\n"; out != want {
		t.Errorf("got %q, want %q", out, want)
	}

	// Found by name and by label from "another process" (a new client).
	other := sbx.NewClient(d.addr)
	byName, err := other.Get(ctx, "life")
	if err != nil || byName.ID != sb.ID {
		t.Fatalf("get by name: got %v, %v; want %s", byName, err, sb.ID)
	}
	for _, tc := range []struct {
		sel  []string
		want int
	}{{[]string{"team=a"}, 1}, {[]string{"team=b"}, 0}, {[]string{"tier", "team!=b"}, 1}, {[]string{"!tier"}, 0}} {
		list, err := other.List(ctx, tc.sel...)
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != tc.want {
			t.Errorf("list %v: got %d sandboxes, want %d", tc.sel, len(list), tc.want)
		}
	}

	// Bad input gets clear errors.
	if _, err := c.Create(ctx, sbx.CreateOptions{Name: "life"}); !sbx.IsAlreadyExists(err) {
		t.Errorf("duplicate name: got %v, want AlreadyExists", err)
	}
	if _, err := c.Create(ctx, sbx.CreateOptions{Name: "bad name!"}); !sbx.IsInvalidArgument(err) || !strings.Contains(err.Error(), "bad name!") {
		t.Errorf("bad name: got %v, want InvalidArgument naming it", err)
	}
	if _, err := c.Create(ctx, sbx.CreateOptions{MemoryBytes: 1}); !sbx.IsInvalidArgument(err) || !strings.Contains(err.Error(), "memory") {
		t.Errorf("impossible memory: got %v, want InvalidArgument about memory", err)
	}
	if _, err := c.Create(ctx, sbx.CreateOptions{CPUs: 4096}); !sbx.IsInvalidArgument(err) || !strings.Contains(err.Error(), "cpu") {
		t.Errorf("impossible cpus: got %v, want InvalidArgument about cpu", err)
	}
	if _, err := c.Get(ctx, "sb-000000000000"); !sbx.IsNotFound(err) {
		t.Errorf("unknown id: got %v, want NotFound", err)
	}

	// Files.
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	if err := sb.WriteFile(ctx, "/work/here/sub/big.bin", big, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := sb.ReadFile(ctx, "/work/here/sub/big.bin")
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("read back %d bytes (err %v), want %d identical bytes", len(got), err, len(big))
	}
	if out := mustRun(t, ctx, sb, "sha256sum sub/big.bin | cut -c1-16; stat -c %a sub/big.bin"); !strings.HasSuffix(out, "600\n") {
		t.Errorf("file mode inside: got %q", out)
	}
	entries, err := sb.ListDir(ctx, "/work/here", true, 0)
	if err != nil || len(entries) != 2 {
		t.Errorf("list recursive: got %d entries (%v), want 2", len(entries), err)
	}
	if err := sb.Rename(ctx, "/work/here/sub/big.bin", "/work/here/moved.bin"); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Stat(ctx, "/work/here/sub/big.bin"); !sbx.IsNotFound(err) {
		t.Errorf("stat of renamed-away file: got %v, want NotFound", err)
	}
	if err := sb.Remove(ctx, "/work/here/sub", true); err != nil {
		t.Fatal(err)
	}

	// Exec: exit codes, stdin, timeouts.
	res, err := sb.RunOpts(ctx, sbx.ExecOptions{Argv: []string{"sh", "-c", "cat; echo err >&2; exit 7"}, Stdin: strings.NewReader("from stdin\n")})
	if err != nil {
		t.Fatal(err)
	}
	if res.Code != 7 || string(res.Stdout) != "from stdin\n" || string(res.Stderr) != "err\n" {
		t.Errorf("got code %d stdout %q stderr %q; want 7, %q, %q", res.Code, res.Stdout, res.Stderr, "from stdin\n", "err\n")
	}
	start := time.Now()
	res, err = sb.RunOpts(ctx, sbx.ExecOptions{Shell: "sleep 100 & sleep 100", Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut || time.Since(start) > 20*time.Second {
		t.Errorf("timeout: got timed_out=%v after %s", res.TimedOut, time.Since(start))
	}
	if out := mustRun(t, ctx, sb, "ps -eo comm | grep -c '^sleep$' || true"); strings.TrimSpace(out) != "0" {
		t.Errorf("sleeps left after the exec timeout: %s", out)
	}
	res, err = sb.Run(ctx, "no-such-command")
	if err != nil || res.Code != 127 {
		t.Errorf("missing command: got %v / %+v, want exit 127", err, res)
	}

	// Stop freezes, start resumes; exec on a stopped sandbox is refused clearly.
	if err := sb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Run(ctx, "true"); err == nil || !strings.Contains(err.Error(), "stopped") {
		t.Errorf("exec on a stopped sandbox: got %v, want an error saying it is stopped", err)
	}
	if err := sb.Start(ctx); err != nil {
		t.Fatal(err)
	}
	mustRun(t, ctx, sb, "true")

	// Inspect shows live stats.
	if err := sb.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if st := sb.Info.GetStats(); st.GetMemoryBytes() <= 0 || st.GetPids() <= 0 {
		t.Errorf("stats: got %+v, want memory and pids > 0", st)
	}

	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, sb.ID); !sbx.IsNotFound(err) {
		t.Errorf("get after destroy: got %v, want NotFound", err)
	}
	if err := sb.Destroy(ctx); !sbx.IsNotFound(err) {
		t.Errorf("second destroy: got %v, want NotFound", err)
	}
	// The name is free again.
	again, err := c.Create(ctx, sbx.CreateOptions{Name: "life"})
	if err != nil {
		t.Fatalf("reuse of a destroyed sandbox's name: %v", err)
	}
	d.remember(again.ID)
	if err := again.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	d.assertNoLeaks()
}

func TestDaemonKill9AndRestart(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	c := d.client()
	sb, err := c.Create(ctx, sbx.CreateOptions{Name: "survivor", Labels: map[string]string{"keep": "yes"}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	mustRun(t, ctx, sb, "echo precious > /root/data.txt; sleep 1000 >/dev/null 2>&1 &")
	stopped, err := c.Create(ctx, sbx.CreateOptions{Name: "frozen"})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(stopped.ID)
	if err := stopped.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	// Kill the daemon while creates are in flight, too.
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if sb, err := c.Create(ctx, sbx.CreateOptions{Labels: map[string]string{"inflight": "1"}}); err == nil {
				d.remember(sb.ID)
			}
			_ = i
		}()
	}
	time.Sleep(15 * time.Millisecond)
	d.kill9()
	wg.Wait()
	d.start()

	got, err := c.Get(ctx, "survivor")
	if err != nil {
		t.Fatalf("sandbox lost across kill -9: %v", err)
	}
	if got.ID != sb.ID || got.Info.GetLabels()["keep"] != "yes" {
		t.Errorf("record after restart: got %s %v", got.ID, got.Info.GetLabels())
	}
	if out := mustRun(t, ctx, got, "cat /root/data.txt; pgrep -c sleep"); out != "precious\n1\n" {
		t.Errorf("after restart: got %q, want the file and the background process intact", out)
	}
	fr, err := c.Get(ctx, "frozen")
	if err != nil {
		t.Fatal(err)
	}
	if fr.Info.GetState() != sbxv1.SandboxState_SANDBOX_STATE_STOPPED {
		t.Errorf("frozen sandbox state after restart: got %v, want STOPPED", fr.Info.GetState())
	}
	if err := fr.Start(ctx); err != nil {
		t.Fatal(err)
	}
	mustRun(t, ctx, fr, "true")

	// In-flight creates either finished (and are listed) or left nothing behind.
	list, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var live []string
	for _, s := range list {
		live = append(live, s.ID)
		if s.Info.GetState() != sbxv1.SandboxState_SANDBOX_STATE_RUNNING {
			t.Errorf("sandbox %s after restart: state %v, want RUNNING", s.ID, s.Info.GetState())
		}
	}
	d.assertNoLeaks(live...)

	// Kill the daemon while destroys are in flight: after a restart each
	// sandbox is either fully there or fully gone.
	var victims []*sbx.Sandbox
	for range 3 {
		v, err := c.Create(ctx, sbx.CreateOptions{Labels: map[string]string{"victim": "1"}})
		if err != nil {
			t.Fatal(err)
		}
		d.remember(v.ID)
		victims = append(victims, v)
	}
	for _, v := range victims {
		wg.Add(1)
		go func() { defer wg.Done(); _ = v.Destroy(ctx) }()
	}
	time.Sleep(3 * time.Millisecond)
	d.kill9()
	wg.Wait()
	d.start()
	list, err = c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	live = live[:0]
	for _, s := range list {
		live = append(live, s.ID)
		mustRun(t, ctx, s, "true")
	}
	d.assertNoLeaks(live...)
	for _, s := range list {
		if err := s.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	d.assertNoLeaks()
}

func TestTimeouts(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	c := d.client()
	short, err := c.Create(ctx, sbx.CreateOptions{Timeout: 1 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(short.ID)
	idle, err := c.Create(ctx, sbx.CreateOptions{IdleTimeout: 1 * time.Second, StopWhenIdle: true})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(idle.ID)
	busy, err := c.Create(ctx, sbx.CreateOptions{IdleTimeout: 1 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(busy.ID)
	// A long exec keeps a sandbox from idling out.
	res, err := busy.RunShell(ctx, "sleep 2.5; echo done")
	if err != nil || string(res.Stdout) != "done\n" {
		t.Fatalf("long exec in an idle-timeout sandbox: %v %+v", err, res)
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		_, errShort := c.Get(ctx, short.ID)
		gi, errIdle := c.Get(ctx, idle.ID)
		_, errBusy := c.Get(ctx, busy.ID)
		if sbx.IsNotFound(errShort) && errIdle == nil && gi.Info.GetState() == sbxv1.SandboxState_SANDBOX_STATE_STOPPED && sbx.IsNotFound(errBusy) {
			if !strings.Contains(errShort.Error(), "lifetime") {
				t.Errorf("error for an expired sandbox should say why: %v", errShort)
			}
			d.assertNoLeaks(idle.ID)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal("timeouts did not fire: want the 1s-lifetime sandbox destroyed, the idle one stopped, the busy one destroyed after its exec")
}

func TestCLI(t *testing.T) {
	d := startDaemon(t)
	out, errOut, code := d.cli("", "create", "--name", "clitest", "--label", "app=cli", "--memory", "128M", "--cpus", "0.5", "--pids", "64", "--disk", "32M", "--timeout", "10m", "--env", "A=1")
	if code != 0 {
		t.Fatalf("create: exit %d: %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	d.remember(id)
	if out, _, code := d.cli("", "exec", "clitest", "--", "sh", "-c", "echo $A; exit 3"); code != 3 || out != "1\n" {
		t.Errorf("exec: got exit %d output %q, want 3 and %q", code, out, "1\n")
	}
	if out, _, code := d.cli("hello\n", "exec", "-i", id, "--", "cat"); code != 0 || out != "hello\n" {
		t.Errorf("exec -i: got exit %d output %q", code, out)
	}
	if out, _, _ := d.cli("", "ls", "-q", "--label", "app=cli"); strings.TrimSpace(out) != id {
		t.Errorf("ls -q --label: got %q, want %q", out, id)
	}
	if out, _, _ := d.cli("", "inspect", "clitest"); !strings.Contains(out, `"memoryBytes"`) || !strings.Contains(out, id) {
		t.Errorf("inspect: got %s", out)
	}
	// cp a directory in and back out.
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "d"), 0o755)
	os.WriteFile(filepath.Join(src, "d", "f.txt"), []byte("payload"), 0o644)
	if _, errOut, code := d.cli("", "cp", src, "clitest:/root/in"); code != 0 {
		t.Fatalf("cp in: %s", errOut)
	}
	if out, _, _ := d.cli("", "exec", "clitest", "--", "cat", "/root/in/d/f.txt"); out != "payload" {
		t.Errorf("file copied in: got %q", out)
	}
	dst := t.TempDir()
	if _, errOut, code := d.cli("", "cp", "clitest:/root/in", filepath.Join(dst, "out")); code != 0 {
		t.Fatalf("cp out: %s", errOut)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "out", "d", "f.txt")); string(b) != "payload" {
		t.Errorf("file copied out: got %q, %v", b, err)
	}
	if _, errOut, code := d.cli("", "create", "--memory", "1"); code == 0 || !strings.Contains(errOut, "memory") {
		t.Errorf("impossible limit: exit %d, stderr %q", code, errOut)
	}
	if _, errOut, code := d.cli("", "exec", "nope", "--", "true"); code == 0 || !strings.Contains(errOut, "not found") {
		t.Errorf("unknown sandbox: exit %d, stderr %q", code, errOut)
	}
	if out, _, code := d.cli("", "run", "--", "python3", "-c", "print('ran')"); code != 0 || out != "ran\n" {
		t.Errorf("run: exit %d output %q", code, out)
	}
	if _, _, code := d.cli("", "stop", "clitest"); code != 0 {
		t.Error("stop failed")
	}
	if _, _, code := d.cli("", "start", "clitest"); code != 0 {
		t.Error("start failed")
	}
	if _, _, code := d.cli("", "rm", "clitest"); code != 0 {
		t.Error("rm failed")
	}
	if out, _, _ := d.cli("", "ls", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("ls after rm (and run's own cleanup): got %q, want nothing", out)
	}
	if out, _, code := d.cli("", "version"); code != 0 || !strings.Contains(out, "runtime oci") {
		t.Errorf("version: exit %d, %q", code, out)
	}
	d.assertNoLeaks()
}

// TestDaemonNotReachable checks that the daemon's API port, environment and
// open files are out of a sandbox's reach.
func TestDaemonNotReachable(t *testing.T) {
	t.Setenv("SBX_E2E_DAEMON_SECRET", "daemon-only-value")
	d := startDaemon(t)
	ctx := ctxT(t, time.Minute)
	sb, err := d.client().Create(ctx, sbx.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	_, port, _ := strings.Cut(d.addr, ":")
	script := `
import socket, os
for host in ("127.0.0.1", "10.0.2.2", "172.17.0.1"):
    s = socket.socket()
    s.settimeout(1)
    try:
        s.connect((host, ` + port + `))
        print("REACHED", host)
    except OSError:
        pass
env = open("/proc/self/environ", "rb").read()
try:
    env += open("/proc/1/environ", "rb").read()
except PermissionError:
    pass  # the agent is not dumpable: even better
print("SECRET" if b"daemon-only-value" in env else "no-secret")
`
	res, err := sb.Run(ctx, "python3", "-c", script)
	if err != nil {
		t.Fatal(err)
	}
	out := string(res.Stdout)
	if strings.Contains(out, "REACHED") || !strings.Contains(out, "no-secret") {
		t.Errorf("sandbox reached the daemon or saw its environment: %s %s", out, res.Stderr)
	}
	// A command holds stdin, stdout, stderr (and ls its directory): nothing inherited.
	fds := mustRun(t, ctx, sb, "ls /proc/self/fd | tr '\\n' ' '")
	if fds != "0 1 2 3 " {
		t.Errorf("open files of a sandbox process: got %q, want only 0 1 2 (and ls's own 3)", fds)
	}
	// The agent's fds (its listening socket among them) cannot be followed or opened.
	for _, cmd := range []string{"readlink /proc/1/fd/3", "exec 9</proc/1/fd/3", "cat /proc/1/environ"} {
		if res, _ := sb.RunShell(ctx, cmd); res.Code == 0 {
			t.Errorf("%q succeeded inside the sandbox: %s", cmd, res.Stdout)
		}
	}
}

// TestInteractiveExec drives ExecInteractive through the daemon: a PTY with
// resize, streamed stdin, and signals.
func TestInteractiveExec(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, time.Minute)
	sb, err := d.client().Create(ctx, sbx.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)

	// PTY: initial size, a resize, input typed at a prompt.
	pr, pw := io.Pipe()
	var out syncBuffer
	p, err := sb.StartExec(ctx, sbx.ExecOptions{
		Shell: `stty size; read line; stty size; echo "got:$line"`, TTY: true, Rows: 30, Cols: 100,
		Stdin: pr, Stdout: &out,
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(out.String(), "30 100") })
	if err := p.Resize(40, 120); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	io.WriteString(pw, "hello\n")
	st, err := p.Wait()
	pw.Close()
	if err != nil {
		t.Fatal(err)
	}
	if st.Code != 0 || !strings.Contains(out.String(), "40 120") || !strings.Contains(out.String(), "got:hello") {
		t.Errorf("pty session: exit %d, output %q", st.Code, out.String())
	}

	// Signals reach the process group.
	pr2, pw2 := io.Pipe()
	defer pw2.Close()
	var out2 syncBuffer
	p2, err := sb.StartExec(ctx, sbx.ExecOptions{Shell: "echo ready; sleep 100", Stdin: pr2, Stdout: &out2})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(out2.String(), "ready") })
	if err := p2.Signal(15); err != nil {
		t.Fatal(err)
	}
	st, err = p2.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if st.Code != 143 || st.Signal != 15 {
		t.Errorf("after SIGTERM: got code %d signal %d, want 143 and 15", st.Code, st.Signal)
	}

	// Only the usual device nodes exist, plus /dev/fuse for the agent's
	// permission layers (opening it is harmless: mounting needs
	// CAP_SYS_ADMIN, which no user process has). crun also links
	// /dev/core to /proc/kcore, which is masked (reads nothing).
	if got := mustRun(t, ctx, sb, "ls /dev | grep -vx core | tr '\\n' ' '"); got != "fd full fuse mqueue null ptmx pts random shm stderr stdin stdout tty urandom zero " {
		t.Errorf("/dev holds %q", got)
	}
	if got := mustRun(t, ctx, sb, "if [ -e /dev/core ] || [ -L /dev/core ]; then readlink /dev/core; head -c 1 /proc/kcore 2>/dev/null | wc -c; fi | tr '\\n' ' '"); got != "" && got != "/proc/kcore 0 " {
		t.Errorf("/dev/core: readlink and bytes of /proc/kcore: %q, want none, or a link to /proc/kcore that reads nothing (masked)", got)
	}
	if got := mustRun(t, ctx, sb, "grep -E '^Cap(Eff|Bnd)' /proc/self/status | tr '\\n\\t' '  '"); strings.Contains(got, "00000000a02405fb") || !strings.Contains(got, "00000000a00405fb") {
		t.Errorf("capabilities of a user process: %q, want Docker's set without CAP_SYS_ADMIN", got)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
