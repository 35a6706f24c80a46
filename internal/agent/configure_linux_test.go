package agent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sbxdev/sbx/api/gen/agent/v1"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

func (a *testAgent) configure(t *testing.T, req *agentv1.ConfigureRequest) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := a.conn.Configure(ctx, connect.NewRequest(req))
	return err
}

// waitFile waits up to 5s for path to exist and returns its contents.
func waitFile(t *testing.T, path string) string {
	t.Helper()
	for range 500 {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			return string(b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s was not written", path)
	return ""
}

func TestConfigure(t *testing.T) {
	a := newTestAgent(t)
	wd := filepath.Join(t.TempDir(), "new", "work")
	marker := filepath.Join(wd, "entrypoint-ran")
	err := a.configure(t, &agentv1.ConfigureRequest{
		Env:     []string{"FOO=bar", "EMPTY=", "DUP=1", "DUP=2", "WITH_EQ=a=b"},
		Workdir: wd,
		Command: []string{"sh", "-c", `echo $$ > pid; echo "$FOO $(pwd)" > entrypoint-ran; exec sleep 100`},
	})
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(wd); err != nil || !fi.IsDir() {
		t.Fatalf("workdir: %v, want it created", err)
	}

	res := a.run(t, &sbxv1.ExecRequest{Argv: []string{"env"}})
	got := strings.Split(strings.TrimSpace(res.stdout), "\n")
	slices.Sort(got)
	want := []string{"DUP=2", "EMPTY=", "FOO=bar", "HOME=/root", "PATH=" + DefaultPath, "WITH_EQ=a=b"}
	if !slices.Equal(got, want) {
		t.Errorf("env: got %q, want %q", got, want)
	}
	// Per-exec env still layers on top.
	if res := a.run(t, &sbxv1.ExecRequest{Shell: `echo "$FOO $X"`, Env: map[string]string{"X": "y"}}); res.stdout != "bar y\n" {
		t.Errorf("env on top: got %q, want %q", res.stdout, "bar y\n")
	}
	if res := a.run(t, &sbxv1.ExecRequest{Argv: []string{"pwd"}}); res.stdout != wd+"\n" {
		t.Errorf("pwd: got %q, want %q", res.stdout, wd+"\n")
	}
	// Relative paths of file operations follow the new workdir too.
	if got := a.srv.resolve("x"); got != filepath.Join(wd, "x") {
		t.Errorf("resolve: got %q, want %q", got, filepath.Join(wd, "x"))
	}
	if got, want := waitFile(t, marker), "bar "+wd+"\n"; got != want {
		t.Errorf("entrypoint output: got %q, want %q", got, want)
	}

	// A second command while the first still runs is refused, and nothing changes.
	err = a.configure(t, &agentv1.ConfigureRequest{Env: []string{"OTHER=1"}, Command: []string{"true"}})
	if got, want := connect.CodeOf(err), connect.CodeFailedPrecondition; got != want {
		t.Errorf("second command: got %v (%v), want %v", got, err, want)
	}
	if res := a.run(t, &sbxv1.ExecRequest{Shell: `echo "$FOO$OTHER"`}); res.stdout != "bar\n" {
		t.Errorf("env after refused configure: got %q, want %q", res.stdout, "bar\n")
	}
	// Without a command it is fine; PATH and HOME given are kept.
	if err := a.configure(t, &agentv1.ConfigureRequest{Env: []string{"PATH=/bin:/usr/bin", "HOME=/home/u"}}); err != nil {
		t.Fatal(err)
	}
	if res := a.run(t, &sbxv1.ExecRequest{Shell: `echo "$PATH $HOME $FOO"; pwd`}); res.stdout != "/bin:/usr/bin /home/u \n"+wd+"\n" {
		t.Errorf("reconfigured: got %q", res.stdout)
	}

	// Once the entrypoint has exited, a new one may be started.
	pid, err := strconv.Atoi(strings.TrimSpace(waitFile(t, filepath.Join(wd, "pid"))))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	second := filepath.Join(wd, "second")
	var lastErr error
	for range 200 {
		if lastErr = a.configure(t, &agentv1.ConfigureRequest{Command: []string{"sh", "-c", "echo ok > " + second}}); connect.CodeOf(lastErr) != connect.CodeFailedPrecondition {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if lastErr != nil {
		t.Fatalf("configure after the entrypoint exited: %v", lastErr)
	}
	waitFile(t, second)
}

func TestConfigureInvalid(t *testing.T) {
	a := newTestAgent(t)
	file := filepath.Join(a.workdir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		req  *agentv1.ConfigureRequest
		code connect.Code
		want string
	}{
		{name: "no equals", req: &agentv1.ConfigureRequest{Env: []string{"OK=1", "NOEQUALS"}}, code: connect.CodeInvalidArgument, want: "NOEQUALS"},
		{name: "empty key", req: &agentv1.ConfigureRequest{Env: []string{"=x"}}, code: connect.CodeInvalidArgument, want: "=x"},
		{name: "nul", req: &agentv1.ConfigureRequest{Env: []string{"A=b\x00c"}}, code: connect.CodeInvalidArgument, want: "A=b"},
		{name: "relative workdir", req: &agentv1.ConfigureRequest{Workdir: "rel/dir"}, code: connect.CodeInvalidArgument, want: "rel/dir"},
		{name: "workdir is a file", req: &agentv1.ConfigureRequest{Workdir: file}, code: connect.CodeFailedPrecondition, want: file},
		{name: "command not found", req: &agentv1.ConfigureRequest{Command: []string{"sbx-no-such-command"}}, code: connect.CodeFailedPrecondition, want: "sbx-no-such-command"},
		{name: "empty command", req: &agentv1.ConfigureRequest{Command: []string{""}}, code: connect.CodeInvalidArgument, want: "command"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := a.configure(t, tt.req)
			if got := connect.CodeOf(err); got != tt.code {
				t.Fatalf("code: got %v (%v), want %v", got, err, tt.code)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error: got %q, want it to name %q", err, tt.want)
			}
		})
	}
	// Nothing was applied.
	if res := a.run(t, &sbxv1.ExecRequest{Shell: `echo "$SBX_TEST $OK"; pwd`}); res.stdout != "base \n"+a.workdir+"\n" {
		t.Errorf("after rejected configures: got %q", res.stdout)
	}
}

func TestConfigureRacesExec(t *testing.T) {
	a := newTestAgent(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 20 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			a.conn.Configure(ctx, connect.NewRequest(&agentv1.ConfigureRequest{Env: []string{"N=" + strings.Repeat("x", i)}, Workdir: a.workdir}))
			cancel()
		}
	}()
	for range 20 {
		res := a.run(t, &sbxv1.ExecRequest{Shell: `echo "$N"`})
		if res.exited.GetExitCode() != 0 {
			t.Errorf("exec during configure: %v", res.exited)
		}
	}
	<-done
}
