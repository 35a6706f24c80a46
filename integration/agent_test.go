package integration

import (
	"strings"
	"testing"
)

// TestAgentSurvivesSandboxCode: code in a sandbox cannot kill, stop or
// replace the agent (PID 1), and cannot signal it away through its own
// process group; the sandbox keeps answering afterwards.
func TestAgentSurvivesSandboxCode(t *testing.T) {
	_, sb, ctx := codeSandbox(t)
	for _, script := range []string{
		"kill -KILL 1", "kill -TERM 1", "kill -INT 1", "kill -HUP 1", "kill -STOP 1", "kill -QUIT 1",
		"kill -KILL -1", "kill -USR1 1; kill -USR2 1; kill -PIPE 1",
	} {
		res, err := sb.RunShell(ctx, script+"; sleep 0.1; echo done")
		if err != nil {
			t.Fatalf("%s: %v", script, err)
		}
		// kill -KILL -1 kills the shell itself too: its result may be 137.
		if res.Code != 0 && !(script == "kill -KILL -1" && res.Code == 137) {
			t.Logf("%s: exit %d %q", script, res.Code, res.Stderr)
		}
		if got := mustRun(t, ctx, sb, "echo alive; cat /proc/1/status | grep ^State"); !strings.HasPrefix(got, "alive\n") ||
			strings.Contains(got, "stopped") {
			t.Fatalf("after %q: got %q, want the agent alive and running", script, got)
		}
	}
	// Replacing the agent's binary or its socket dir fails.
	for _, script := range []string{"cp /bin/true /.sbx/sbx-agent", "rm -rf /.sbx", "mount -t tmpfs x /.sbx", "umount -l /.sbx"} {
		if res, err := sb.RunShell(ctx, script); err != nil || res.Code == 0 {
			t.Errorf("%q: exit %d, %v; want it refused", script, res.Code, err)
		}
	}
	if got := mustRun(t, ctx, sb, "echo still"); got != "still\n" {
		t.Errorf("got %q after the attempts", got)
	}
}
