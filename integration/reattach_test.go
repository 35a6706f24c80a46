package integration

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestSessionsAndContextsSurviveDaemonRestart kills the daemon (kill -9,
// then a graceful stop) with a shell session and code contexts open: after
// each restart they are listed under the same ids, keep their state, and
// the session's background job still runs; closing them kills their processes.
func TestSessionsAndContextsSurviveDaemonRestart(t *testing.T) {
	d, sb, ctx := codeSandbox(t)
	c := d.client()
	ss, err := sb.CreateSession(ctx, sbx.SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sessRun := func(ss *sbx.Session, cmd string) *sbx.SessionResult {
		t.Helper()
		res, err := ss.Exec(ctx, cmd, sbx.SessionExecOptions{Timeout: time.Minute})
		if err != nil {
			t.Fatalf("session exec %q: %v", cmd, err)
		}
		return res
	}
	sessRun(ss, `cd /tmp; export X=1`)
	sessRun(ss, `sleep 4243 & echo $! > /tmp/reattach-bg.pid`)

	py, err := sb.CreateContext(ctx, "python", sbx.ContextOptions{})
	if err != nil {
		t.Fatal(err)
	}
	codeRun := func(cc *sbx.CodeContext, code string) string {
		t.Helper()
		res, err := cc.Run(ctx, code, sbx.RunCodeOptions{Timeout: time.Minute})
		if err != nil {
			t.Fatalf("run %q: %v", code, err)
		}
		if res.Error != "" {
			t.Fatalf("run %q: error %q (stderr %q)", code, res.Error, res.Stderr)
		}
		return res.Value.GetText()
	}
	codeRun(py, "x = 41")
	var js *sbx.CodeContext
	if hostHas("node", "--version") {
		if js, err = sb.CreateContext(ctx, "javascript", sbx.ContextOptions{}); err != nil {
			t.Fatal(err)
		}
		codeRun(js, "let y = 41")
	}

	// A session whose shell is gone by the time the daemon is back is dropped.
	doomed, err := sb.CreateSession(ctx, sbx.SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sessRun(doomed, `(sleep 1; kill -9 $$) >/dev/null 2>&1 &`)

	// A command running when the daemon dies: its result is lost, the session lives on.
	running := make(chan error, 1)
	go func() {
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		_, err := ss.Exec(rctx, "sleep 2; export LATE=1", sbx.SessionExecOptions{})
		running <- err
	}()
	time.Sleep(500 * time.Millisecond)

	check := func(t *testing.T, when string) {
		t.Helper()
		sessions, err := sb.Sessions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, s := range sessions {
			ids = append(ids, s.ID)
		}
		if !slices.Contains(ids, ss.ID) || slices.Contains(ids, doomed.ID) {
			t.Errorf("%s: sessions %v, want %s listed and %s dropped", when, ids, ss.ID, doomed.ID)
		}
		if got := string(sessRun(ss, `echo $X; pwd`).Stdout); got != "1\n/tmp\n" {
			t.Errorf("%s: session state: got %q, want \"1\\n/tmp\\n\"", when, got)
		}
		if res := sessRun(ss, `kill -0 $(cat /tmp/reattach-bg.pid) && echo alive`); string(res.Stdout) != "alive\n" {
			t.Errorf("%s: background job: got %q (stderr %q), want alive", when, res.Stdout, res.Stderr)
		}
		contexts, err := sb.Contexts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var cids []string
		for _, cc := range contexts {
			cids = append(cids, cc.ID)
		}
		if !slices.Contains(cids, py.ID) {
			t.Errorf("%s: contexts %v, want %s listed", when, cids, py.ID)
		}
		if got := codeRun(py, "x + 1"); got != "42" {
			t.Errorf("%s: python context: x + 1 gave %q, want 42", when, got)
		}
		if js != nil {
			if !slices.Contains(cids, js.ID) {
				t.Errorf("%s: contexts %v, want %s listed", when, cids, js.ID)
			}
			if got := codeRun(js, "y + 1"); got != "42" {
				t.Errorf("%s: javascript context: y + 1 gave %q, want 42", when, got)
			}
		}
	}

	d.kill9()
	<-running // the client's stream broke with the daemon
	time.Sleep(1500 * time.Millisecond)
	d.start()
	sb, err = c.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	check(t, "after kill -9")
	if got := string(sessRun(ss, `echo $LATE`).Stdout); got != "1\n" {
		t.Errorf("the command cut off by the restart did not finish in the shell: LATE=%q", got)
	}

	d.stop()
	d.start()
	check(t, "after a graceful restart")

	// Stopped (frozen) across a restart: back once the sandbox runs again.
	if err := sb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	d.kill9()
	d.start()
	if sb, err = c.Get(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := sb.Start(ctx); err != nil {
		t.Fatal(err)
	}
	check(t, "after a restart with the sandbox stopped")

	if err := ss.Close(ctx); err != nil {
		t.Fatal(err)
	}
	var got string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if got = procsMatching(ctx, t, sb, "sleep 4243"); got == "" {
			break
		}
	}
	if got != "" {
		t.Errorf("after close, still running: %s", got)
	}
	for _, cc := range []*sbx.CodeContext{py, js} {
		if cc == nil {
			continue
		}
		if err := cc.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if got = procsMatching(ctx, t, sb, "sbx-code/kernels"); got == "" {
			break
		}
	}
	if got != "" {
		t.Errorf("after closing the contexts, kernels still run: %s", got)
	}
	// Destroying a sandbox forgets its sessions at once (not at the next restart).
	sb2, err := c.Create(ctx, sbx.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb2.ID)
	ss2, err := sb2.CreateSession(ctx, sbx.SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb2.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { list, err := c.Sessions(ctx, ""); return err == nil && len(list) == 0 })

	// Closed ones stay closed across a restart.
	d.kill9()
	d.start()
	if b, err := os.ReadFile(filepath.Join(d.dataDir, "daemon.log")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "re-attached") || strings.Contains(l, "dropped") {
				t.Log(l)
			}
			if strings.Contains(l, "dropped") && strings.Contains(l, ss2.ID) {
				t.Errorf("the session of a destroyed sandbox was still recorded at the restart: %s", l)
			}
		}
	}
	if list, err := sb.Sessions(ctx); err != nil || len(list) != 0 {
		t.Errorf("sessions after close and restart: got %v, %v, want none", list, err)
	}
	if list, err := sb.Contexts(ctx); err != nil || len(list) != 0 {
		t.Errorf("contexts after close and restart: got %v, %v, want none", list, err)
	}
}

// TestEntrypointSurvivesDaemonRestart: a sandbox's own command is a detached
// process of its agent that no session or context record names; a daemon
// coming back (gracefully or after kill -9) must leave it running. The
// start-up sweep of detached processes a crash left unrecorded once killed
// it along with them (a box serving HTTP stopped answering after a restart).
func TestEntrypointSurvivesDaemonRestart(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	sb := newBox(t, ctx, d, sbx.CreateOptions{Command: []string{"python3", "-m", "http.server", "8000"}})
	serving := func() bool {
		code, err := fetchCode(ctx, sb, "127.0.0.1:8000")
		return err == nil && code == 0
	}
	waitUntil(t, 30*time.Second, serving, func() string { return "the entrypoint never served" })
	for _, restart := range []struct {
		name string
		do   func()
	}{
		{"graceful restart", func() { d.stop(); d.start() }},
		{"kill -9", func() { d.kill9(); d.start() }},
	} {
		restart.do()
		if _, err := d.client().Get(ctx, sb.ID); err != nil {
			t.Fatalf("after a %s: %v", restart.name, err)
		}
		// The sweep runs before the daemon serves: by now it has run.
		if !serving() {
			t.Fatalf("after a %s the sandbox's entrypoint no longer serves:\n%s", restart.name, procsMatching(ctx, t, sb, "http.server"))
		}
		// Its output stayed in the box: the requests it logged are there.
		var errb bytes.Buffer
		res, err := d.client().Sandbox(sb.ID).Logs(ctx, sbx.LogsOptions{Stderr: &errb})
		if err != nil || res.Exit != nil || !strings.Contains(errb.String(), "GET /") {
			t.Errorf("logs after a %s: %v, exit %+v, stderr %q; want the logged requests and no exit", restart.name, err, res, errb.String())
		}
	}
}
