package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

func TestHello(t *testing.T) {
	a := newTestAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := a.conn.Hello(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := resp.GetProtocolVersion(), uint32(ProtocolVersion); got != want {
		t.Errorf("protocol version: got %d, want %d", got, want)
	}
	if got, want := resp.GetAgentVersion(), Version; got != want {
		t.Errorf("agent version: got %q, want %q", got, want)
	}
	if resp.GetPid() <= 0 {
		t.Errorf("pid: got %d, want > 0", resp.GetPid())
	}
}

func TestExecArgv(t *testing.T) {
	a := newTestAgent(t)
	tests := []struct {
		name       string
		req        *sbxv1.ExecRequest
		wantOut    string
		wantErr    string
		wantCode   int32
		wantSignal int32
	}{
		{name: "true", req: &sbxv1.ExecRequest{Argv: []string{"true"}}},
		{name: "false", req: &sbxv1.ExecRequest{Argv: []string{"false"}}, wantCode: 1},
		{name: "echo", req: &sbxv1.ExecRequest{Argv: []string{"echo", "hello", "world"}}, wantOut: "hello world\n"},
		{name: "separate streams", req: &sbxv1.ExecRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}}, wantOut: "out\n", wantErr: "err\n", wantCode: 3},
		{name: "shell", req: &sbxv1.ExecRequest{Shell: "echo $((1+2)) | tr 3 x"}, wantOut: "x\n"},
		{name: "signalled", req: &sbxv1.ExecRequest{Shell: "kill -TERM $$"}, wantCode: 128 + 15, wantSignal: 15},
		{name: "env", req: &sbxv1.ExecRequest{Shell: `echo "$SBX_TEST $EXTRA $HOME"`, Env: map[string]string{"EXTRA": "x"}}, wantOut: "base x /root\n"},
		{name: "env override", req: &sbxv1.ExecRequest{Shell: `echo "$SBX_TEST"`, Env: map[string]string{"SBX_TEST": "over"}}, wantOut: "over\n"},
		{name: "workdir default", req: &sbxv1.ExecRequest{Argv: []string{"pwd"}}, wantOut: a.workdir + "\n"},
		{name: "workdir absolute", req: &sbxv1.ExecRequest{Argv: []string{"pwd"}, Workdir: "/"}, wantOut: "/\n"},
		{name: "stdin up front", req: &sbxv1.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("abc")}, wantOut: "abc"},
		{name: "no stdin is devnull", req: &sbxv1.ExecRequest{Argv: []string{"cat"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := a.run(t, tt.req)
			if got := res.stdout; got != tt.wantOut {
				t.Errorf("stdout: got %q, want %q", got, tt.wantOut)
			}
			if got := res.stderr; got != tt.wantErr {
				t.Errorf("stderr: got %q, want %q", got, tt.wantErr)
			}
			if got := res.exited.GetExitCode(); got != tt.wantCode {
				t.Errorf("exit code: got %d, want %d (error %q)", got, tt.wantCode, res.exited.GetError())
			}
			if got := res.exited.GetSignal(); got != tt.wantSignal {
				t.Errorf("signal: got %d, want %d", got, tt.wantSignal)
			}
			if res.pid <= 0 {
				t.Errorf("started pid: got %d, want > 0", res.pid)
			}
		})
	}
}

func TestExecStartErrors(t *testing.T) {
	a := newTestAgent(t)
	noexec := filepath.Join(a.workdir, "noexec")
	if err := os.WriteFile(noexec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		req      *sbxv1.ExecRequest
		wantCode int32
	}{
		{name: "not found", req: &sbxv1.ExecRequest{Argv: []string{"sbx-no-such-command"}}, wantCode: 127},
		{name: "not found by path", req: &sbxv1.ExecRequest{Argv: []string{"/no/such/binary"}}, wantCode: 127},
		{name: "not executable", req: &sbxv1.ExecRequest{Argv: []string{"./noexec"}}, wantCode: 126},
		{name: "missing workdir", req: &sbxv1.ExecRequest{Argv: []string{"true"}, Workdir: "/no/such/dir"}, wantCode: 127},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := a.run(t, tt.req)
			if got := res.exited.GetExitCode(); got != tt.wantCode {
				t.Errorf("exit code: got %d, want %d", got, tt.wantCode)
			}
			if res.exited.GetError() == "" {
				t.Errorf("error: got empty, want a message")
			}
			if res.pid != 0 {
				t.Errorf("started pid: got %d, want no started event", res.pid)
			}
		})
	}
}

func TestExecInvalid(t *testing.T) {
	a := newTestAgent(t)
	tests := []struct {
		name string
		req  *sbxv1.ExecRequest
		want string
	}{
		{name: "both", req: &sbxv1.ExecRequest{Argv: []string{"true"}, Shell: "true"}, want: "argv"},
		{name: "neither", req: &sbxv1.ExecRequest{}, want: "shell"},
		{name: "bad env", req: &sbxv1.ExecRequest{Argv: []string{"true"}, Env: map[string]string{"A=B": "c"}}, want: "env"},
		{name: "nul in argv", req: &sbxv1.ExecRequest{Argv: []string{"echo", "a\x00b"}}, want: "invalid argument"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			stream := a.conn.Exec(ctx)
			stream.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Start{Start: tt.req}})
			_, err := collect(stream)
			if got, want := connect.CodeOf(err), connect.CodeInvalidArgument; got != want {
				t.Fatalf("code: got %v (%v), want %v", got, err, want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error: got %q, want it to name %q", err, tt.want)
			}
		})
	}
}

func TestExecStdinStreamed(t *testing.T) {
	a := newTestAgent(t)
	res := a.run(t, &sbxv1.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("up front, "), StdinOpen: true},
		&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Stdin{Stdin: []byte("hello ")}},
		&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Stdin{Stdin: []byte("world")}},
		&sbxv1.ExecInput{Event: &sbxv1.ExecInput_StdinClose{StdinClose: true}},
	)
	if got, want := res.stdout, "up front, hello world"; got != want {
		t.Errorf("stdout: got %q, want %q", got, want)
	}
	if got := res.exited.GetExitCode(); got != 0 {
		t.Errorf("exit code: got %d, want 0", got)
	}
}

// processGone reports whether pid has exited (gone or a zombie) within 2s.
func processGone(pid int) bool {
	for range 200 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true
		}
		if _, rest, ok := strings.Cut(string(b), ") "); ok && strings.HasPrefix(rest, "Z") {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

func TestExecTimeoutKillsGroup(t *testing.T) {
	a := newTestAgent(t)
	start := time.Now()
	res := a.run(t, &sbxv1.ExecRequest{Shell: "sleep 100 & echo $!; sleep 100", TimeoutMs: 300})
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v, want about 300ms", d)
	}
	if !res.exited.GetTimedOut() {
		t.Errorf("timed_out: got false, want true")
	}
	if got, want := res.exited.GetExitCode(), int32(137); got != want {
		t.Errorf("exit code: got %d, want %d", got, want)
	}
	bg, err := strconv.Atoi(strings.TrimSpace(res.stdout))
	if err != nil {
		t.Fatalf("background pid: got %q: %v", res.stdout, err)
	}
	for _, pid := range []int{int(res.pid), bg} {
		if !processGone(pid) {
			t.Errorf("process %d still running after timeout", pid)
		}
	}
}

// interactive starts req and returns the stream after reading stdout up to
// and including marker.
func interactive(t *testing.T, a *testAgent, req *sbxv1.ExecRequest, marker string) (*connect.BidiStreamForClient[sbxv1.ExecInput, sbxv1.ExecOutput], string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	stream := a.conn.Exec(ctx)
	if err := stream.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Start{Start: req}}); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for !strings.Contains(out.String(), marker) {
		msg, err := stream.Receive()
		if err != nil {
			t.Fatalf("waiting for %q (got %q): %v", marker, out.String(), err)
		}
		out.Write(msg.GetStdout())
		if msg.GetExited() != nil {
			t.Fatalf("exited before %q: %v", marker, msg.GetExited())
		}
	}
	return stream, out.String()
}

func TestExecSignal(t *testing.T) {
	a := newTestAgent(t)
	stream, _ := interactive(t, a, &sbxv1.ExecRequest{
		Shell:     `trap 'echo got; exit 7' USR1; echo ready; while :; do sleep 0.05; done`,
		StdinOpen: true,
	}, "ready")
	if err := stream.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Signal{Signal: int32(syscall.SIGUSR1)}}); err != nil {
		t.Fatal(err)
	}
	res, err := collect(stream)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := res.exited.GetExitCode(), int32(7); got != want {
		t.Errorf("exit code: got %d, want %d", got, want)
	}
	if got, want := res.stdout, "got\n"; got != want {
		t.Errorf("stdout: got %q, want %q", got, want)
	}
}

func TestExecPTY(t *testing.T) {
	a := newTestAgent(t)
	res := a.run(t, &sbxv1.ExecRequest{Shell: "stty size; echo $TERM; echo err >&2; test -t 0", Tty: true, Size: &sbxv1.TerminalSize{Rows: 30, Cols: 100}})
	if got, want := res.stdout, "30 100\r\nxterm-256color\r\nerr\r\n"; got != want {
		t.Errorf("stdout: got %q, want %q", got, want)
	}
	if res.stderr != "" {
		t.Errorf("stderr: got %q, want empty", res.stderr)
	}
	if got := res.exited.GetExitCode(); got != 0 {
		t.Errorf("exit code (test -t 0): got %d, want 0", got)
	}

	res = a.run(t, &sbxv1.ExecRequest{Argv: []string{"stty", "size"}, Tty: true})
	if got, want := res.stdout, "24 80\r\n"; got != want {
		t.Errorf("default size: got %q, want %q", got, want)
	}
}

func TestExecPTYResize(t *testing.T) {
	a := newTestAgent(t)
	stream, _ := interactive(t, a, &sbxv1.ExecRequest{Shell: "echo ready; read x; stty size", Tty: true, StdinOpen: true}, "ready")
	stream.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Resize{Resize: &sbxv1.TerminalSize{Rows: 50, Cols: 120}}})
	stream.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Stdin{Stdin: []byte("go\n")}})
	res, err := collect(stream)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.stdout, "50 120\r\n") {
		t.Errorf("stdout: got %q, want it to contain %q", res.stdout, "50 120\r\n")
	}
}

func TestExecCancelKillsGroup(t *testing.T) {
	a := newTestAgent(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream := a.conn.Exec(ctx)
	stream.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Start{Start: &sbxv1.ExecRequest{Shell: "sleep 100 & echo $!; sleep 100"}}})
	var pid int32
	var out string
	for !strings.Contains(out, "\n") {
		msg, err := stream.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if s := msg.GetStarted(); s != nil {
			pid = s.GetPid()
		}
		out += string(msg.GetStdout())
	}
	cancel()
	// As a real client does: notice the cancellation on the stream.
	if _, err := stream.Receive(); err == nil {
		t.Errorf("Receive after cancel: got nil error, want canceled")
	}
	stream.CloseResponse()
	bg, _ := strconv.Atoi(strings.TrimSpace(out))
	for _, p := range []int{int(pid), bg} {
		if !processGone(p) {
			t.Errorf("process %d still running after cancel", p)
		}
	}
}

func TestExecBackgroundHoldsOutput(t *testing.T) {
	a := newTestAgent(t)
	for _, tty := range []bool{false, true} {
		start := time.Now()
		res := a.run(t, &sbxv1.ExecRequest{Shell: "sleep 3 & echo done", Tty: tty})
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("tty %v: took %v, want exit soon after the leader", tty, d)
		}
		if got := res.stdout; !strings.HasPrefix(got, "done") {
			t.Errorf("tty %v: stdout: got %q, want %q", tty, got, "done")
		}
	}
}

func TestExecLargeOutput(t *testing.T) {
	a := newTestAgent(t)
	res := a.run(t, &sbxv1.ExecRequest{Shell: "head -c 3000000 /dev/zero; head -c 1000000 /dev/zero >&2"})
	if got, want := len(res.stdout), 3000000; got != want {
		t.Errorf("stdout bytes: got %d, want %d", got, want)
	}
	if got, want := len(res.stderr), 1000000; got != want {
		t.Errorf("stderr bytes: got %d, want %d", got, want)
	}
}

// zombieChildren lists children of pid that are zombies.
func zombieChildren(t *testing.T, pid int) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var zs []string
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		_, rest, _ := strings.Cut(string(b), ") ")
		f := strings.Fields(rest)
		if len(f) > 1 && f[0] == "Z" && f[1] == strconv.Itoa(pid) {
			zs = append(zs, e.Name())
		}
	}
	return zs
}

func TestExecReapsChildren(t *testing.T) {
	a := newTestAgent(t)
	a.run(t, &sbxv1.ExecRequest{Argv: []string{"true"}}) // warm up connections
	before := runtime.NumGoroutine()
	for range 50 {
		a.run(t, &sbxv1.ExecRequest{Argv: []string{"true"}})
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			// Not a.run: t.Fatal must not be called off the test goroutine.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			stream := a.conn.Exec(ctx)
			stream.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Start{Start: &sbxv1.ExecRequest{Shell: "echo hi"}}})
			res, err := collect(stream)
			if err != nil {
				t.Errorf("concurrent exec: %v", err)
				return
			}
			if res.stdout != "hi\n" || res.exited.GetExitCode() != 0 {
				t.Errorf("concurrent exec: got %q, %v, want \"hi\\n\", 0", res.stdout, res.exited)
			}
		})
	}
	wg.Wait()
	var after int
	for range 100 {
		if after = runtime.NumGoroutine(); after <= before+10 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if after > before+10 {
		t.Errorf("goroutines: got %d after 70 execs, want about %d (leak)", after, before)
	}
	if zs := zombieChildren(t, os.Getpid()); len(zs) > 0 {
		t.Errorf("zombie children: got %v, want none", zs)
	}
	a.srv.reaper.mu.Lock()
	n := len(a.srv.reaper.waiters)
	a.srv.reaper.mu.Unlock()
	if n != 0 {
		t.Errorf("registered waiters: got %d, want 0", n)
	}
}

func TestExecKeepalive(t *testing.T) {
	old := keepaliveIdle
	keepaliveIdle = 50 * time.Millisecond
	t.Cleanup(func() { keepaliveIdle = old })
	a := newTestAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream := a.conn.Exec(ctx)
	stream.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Start{Start: &sbxv1.ExecRequest{Argv: []string{"sleep", "0.3"}}}})
	keepalives := 0
	for {
		msg, err := stream.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if msg.GetKeepalive() != nil {
			keepalives++
		}
		if msg.GetExited() != nil {
			break
		}
	}
	if keepalives < 2 {
		t.Errorf("keepalives during 300ms of silence: got %d, want >= 2", keepalives)
	}
}

// BenchmarkExecTrue is one exec of /bin/true through agentconn over a Unix
// socket: start, started, exited, end of stream. Besides ns/op it reports the
// median (p50-ns) and its ratio to the median of a bare fork+exec+wait of the
// same binary measured right after (x-forkexec, see BenchmarkForkExecTrue):
// the agent's overhead with the machine's noise mostly divided out.
func BenchmarkExecTrue(b *testing.B) {
	a := newTestAgent(b)
	req := &sbxv1.ExecRequest{Argv: []string{"/bin/true"}}
	a.run(b, req) // warm up the connection
	var lat []time.Duration
	cpu0 := cpuTime(b)
	for b.Loop() {
		t0 := time.Now()
		a.run(b, req)
		lat = append(lat, time.Since(t0))
	}
	cpu := cpuTime(b) - cpu0
	base := make([]time.Duration, min(len(lat), 500))
	for i := range base {
		t0 := time.Now()
		forkExecTrue(b)
		base[i] = time.Since(t0)
	}
	p50, base50 := median(lat), median(base)
	b.ReportMetric(float64(p50), "p50-ns")
	b.ReportMetric(float64(cpu)/float64(len(lat)), "cpu-ns/op")
	b.ReportMetric(float64(p50)/float64(base50), "x-forkexec")
}

// BenchmarkForkExecTrue is the floor: syscall.ForkExec of /bin/true and wait4.
func BenchmarkForkExecTrue(b *testing.B) {
	for b.Loop() {
		forkExecTrue(b)
	}
}

// cpuTime is the user+system time this process (agent and client) has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func median(d []time.Duration) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	return d[len(d)/2]
}

func forkExecTrue(b *testing.B) {
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		b.Fatal(err)
	}
	defer devnull.Close()
	fd := devnull.Fd()
	pid, err := syscall.ForkExec("/bin/true", []string{"/bin/true"}, &syscall.ProcAttr{
		Env:   []string{"PATH=/usr/bin:/bin"},
		Files: []uintptr{fd, fd, fd},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	if err != nil {
		b.Fatal(err)
	}
	var ws syscall.WaitStatus
	for {
		_, err = syscall.Wait4(pid, &ws, 0, nil)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil || ws.ExitStatus() != 0 {
		b.Fatalf("wait: %v, %v", err, ws)
	}
}
