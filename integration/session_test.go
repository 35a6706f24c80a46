package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// procsMatching lists the sandbox's processes whose command line contains pat.
func procsMatching(ctx context.Context, t *testing.T, sb *sbx.Sandbox, pat string) string {
	t.Helper()
	res, err := sb.RunShell(ctx, `for p in /proc/[0-9]*; do c=$(tr '\0' ' ' < $p/cmdline 2>/dev/null); case "$c" in *"`+pat+`"*) echo "${p#/proc/} $c";; esac; done`)
	if err != nil {
		t.Fatal(err)
	}
	// The search itself matches the pattern: ignore shells.
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n") {
		if l != "" && !strings.Contains(l, "/proc/") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestShellSession(t *testing.T) {
	d, sb, ctx := codeSandbox(t)
	ss, err := sb.CreateSession(ctx, sbx.SessionOptions{Env: map[string]string{"GREETING": "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	run := func(cmd string, timeout time.Duration) *sbx.SessionResult {
		t.Helper()
		res, err := ss.Exec(ctx, cmd, sbx.SessionExecOptions{Timeout: timeout})
		if err != nil {
			t.Fatalf("exec %q: %v", cmd, err)
		}
		return res
	}

	t.Run("output-and-exit-codes", func(t *testing.T) {
		res := run(`echo out; echo err >&2; printf 'no newline'; exit_with() { return $1; }; exit_with 7`, 0)
		if string(res.Stdout) != "out\nno newline" || string(res.Stderr) != "err\n" || res.ExitCode != 7 || res.TimedOut {
			t.Errorf("got stdout %q stderr %q exit %d timed out %v", res.Stdout, res.Stderr, res.ExitCode, res.TimedOut)
		}
		if res := run(`echo $GREETING`, 0); string(res.Stdout) != "hi\n" || res.ExitCode != 0 {
			t.Errorf("env: got %q exit %d", res.Stdout, res.ExitCode)
		}
		if res := run(`if then fi`, 0); res.ExitCode == 0 || len(res.Stderr) == 0 {
			t.Errorf("syntax error: got exit %d stderr %q", res.ExitCode, res.Stderr)
		}
		if res := run(`true`, 0); res.ExitCode != 0 || len(res.Stdout)+len(res.Stderr) != 0 {
			t.Errorf("after a syntax error: got exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
		}
	})
	t.Run("cd-and-export-persist", func(t *testing.T) {
		run(`mkdir -p /tmp/sess-dir && cd /tmp/sess-dir && export SESS_VAR=persisted`, 0)
		if res := run(`pwd; echo $SESS_VAR`, 0); string(res.Stdout) != "/tmp/sess-dir\npersisted\n" {
			t.Errorf("got %q, want the cwd and variable of the previous command", res.Stdout)
		}
	})
	t.Run("background-job-keeps-running", func(t *testing.T) {
		run(`sleep 4241 & echo $! > /tmp/sess-bg.pid`, 0)
		time.Sleep(300 * time.Millisecond)
		if res := run(`kill -0 $(cat /tmp/sess-bg.pid) && jobs | grep -c 'sleep 4241'`, 0); res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != "1" {
			t.Errorf("background job: got exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
		}
	})
	t.Run("venv-persists", func(t *testing.T) {
		if res := run(`python3 -m venv /tmp/sess-venv`, 2*time.Minute); res.ExitCode != 0 {
			t.Skipf("python3 -m venv does not work here: %s", res.Stderr)
		}
		run(`. /tmp/sess-venv/bin/activate`, 0)
		if res := run(`echo $VIRTUAL_ENV; command -v python`, 0); string(res.Stdout) != "/tmp/sess-venv\n/tmp/sess-venv/bin/python\n" {
			t.Errorf("got %q, want the venv active", res.Stdout)
		}
		run(`deactivate`, 0)
	})
	t.Run("timeout-interrupts-command-not-session", func(t *testing.T) {
		start := time.Now()
		res := run(`sleep 100`, time.Second)
		if !res.TimedOut || res.ExitCode != 130 || res.Error != "" || time.Since(start) > 20*time.Second {
			t.Errorf("got timed out %v exit %d error %q after %v, want an interrupted sleep (130)", res.TimedOut, res.ExitCode, res.Error, time.Since(start))
		}
		if res := run(`echo still here; pwd; echo $SESS_VAR`, 0); string(res.Stdout) != "still here\n/tmp/sess-dir\npersisted\n" || res.ExitCode != 0 {
			t.Errorf("after the timeout: got %q exit %d", res.Stdout, res.ExitCode)
		}
		if res := run(`kill -0 $(cat /tmp/sess-bg.pid)`, 0); res.ExitCode != 0 {
			t.Errorf("the background job did not survive the interrupt")
		}
	})
	t.Run("timeout-abandons-rest-of-compound-command", func(t *testing.T) {
		res := run(`cd /tmp; export SESS_PART=1; sleep 100; echo after-sleep; touch /tmp/sess-after`, time.Second)
		if !res.TimedOut || res.ExitCode != 130 || strings.Contains(string(res.Stdout), "after-sleep") {
			t.Errorf("got timed out %v exit %d stdout %q, want the rest of the command abandoned", res.TimedOut, res.ExitCode, res.Stdout)
		}
		if res := run(`test -e /tmp/sess-after && echo ran; echo $SESS_PART; pwd`, 0); string(res.Stdout) != "1\n/tmp\n" {
			t.Errorf("after the timeout: got %q, want the state before the sleep kept and nothing after it run", res.Stdout)
		}
		run(`cd /tmp/sess-dir`, 0)
	})
	t.Run("list", func(t *testing.T) {
		list, err := sb.Sessions(ctx)
		if err != nil || len(list) != 1 || list[0].ID != ss.ID || list[0].Shell != "/bin/bash" {
			t.Errorf("got %v, %v; want just %s", list, err, ss.ID)
		}
		out, _, code := d.cli("", "session", "ls", sb.ID)
		if code != 0 || !strings.Contains(out, ss.ID) {
			t.Errorf("sbx session ls: got %q exit %d", out, code)
		}
	})
	t.Run("close-kills-background-jobs", func(t *testing.T) {
		if got := procsMatching(ctx, t, sb, "sleep 4241"); got == "" {
			t.Fatal("the background sleep is not running before close")
		}
		if err := ss.Close(ctx); err != nil {
			t.Fatal(err)
		}
		var got string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			if got = procsMatching(ctx, t, sb, "sleep 4241"); got == "" {
				break
			}
		}
		if got != "" {
			t.Errorf("after close, still running: %s", got)
		}
		if _, err := ss.Exec(ctx, "true", sbx.SessionExecOptions{}); !sbx.IsNotFound(err) {
			t.Errorf("exec in a closed session: got %v, want not found", err)
		}
		if list, _ := sb.Sessions(ctx); len(list) != 0 {
			t.Errorf("sessions after close: %v", list)
		}
	})
}

func TestShellSessionCLI(t *testing.T) {
	d, sb, _ := codeSandbox(t)
	out, errOut, code := d.cli("", "session", "create", "-w", "/tmp", sb.ID)
	if code != 0 {
		t.Fatalf("sbx session create: exit %d: %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	if _, errOut, code := d.cli("", "session", "exec", id, "export X=42; cd /"); code != 0 {
		t.Fatalf("sbx session exec: exit %d: %s", code, errOut)
	}
	if out, _, code := d.cli("", "session", "exec", id, "echo $X $PWD; exit_with() { return 3; }; exit_with"); out != "42 /\n" || code != 3 {
		t.Errorf("sbx session exec: got %q exit %d, want \"42 /\" and 3", out, code)
	}
	if _, errOut, code := d.cli("", "session", "rm", id); code != 0 {
		t.Errorf("sbx session rm: exit %d: %s", code, errOut)
	}
	if _, _, code := d.cli("", "session", "exec", id, "true"); code == 0 {
		t.Errorf("sbx session exec after rm succeeded")
	}
}
