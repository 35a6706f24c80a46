package integration

import (
	"testing"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// entryForker forks until the pids limit refuses, lets its children go and
// exits 3 (2 if never refused).
const entryForker = `import os, signal, sys, time
kids, refused = [], False
try:
    while True:
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        kids.append(pid)
except OSError:
    refused = True
for k in kids:
    os.kill(k, signal.SIGKILL)
    os.waitpid(k, 0)
sys.exit(3 if refused else 2)
`

// TestEntrypointLimitFlags: the sandbox's own command is told what its
// limits did over its own life, as an exec is, through Wait and Logs and
// the same on every look. Before, its exit took the box-wide "OOM kills
// since last looked" count, so a second Wait (or a Logs after a Wait) of an
// OOM-killed entrypoint said oom_killed false, and pids_limit_hit was never
// set for it.
func TestEntrypointLimitFlags(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	c := d.client()
	for _, tc := range []struct {
		name       string
		cmd        []string
		code       int
		oom, pids  bool
		createOpts sbx.CreateOptions
	}{
		{"memory hog", []string{"python3", "-c", "b = bytearray(256 << 20)"}, 137, true, false,
			sbx.CreateOptions{MemoryBytes: 64 << 20, DiskBytes: 16 << 20}},
		{"forker", []string{"python3", "-c", entryForker}, 3, false, true,
			sbx.CreateOptions{MemoryBytes: 256 << 20, Pids: 64}},
		{"plain failure", []string{"sh", "-c", "exit 7"}, 7, false, false, sbx.CreateOptions{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := tc.createOpts
			opts.Command = tc.cmd
			sb, err := c.Create(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			d.remember(sb.ID)
			check := func(what string, st *sbx.ExitStatus) {
				t.Helper()
				if st == nil {
					t.Fatalf("%s: no exit", what)
				}
				if st.Code != tc.code || st.OOMKilled != tc.oom || st.PidsLimitHit != tc.pids {
					t.Errorf("%s: exit %d, oom_killed %v, pids_limit_hit %v; want %d, %v, %v",
						what, st.Code, st.OOMKilled, st.PidsLimitHit, tc.code, tc.oom, tc.pids)
				}
			}
			for i := range 2 {
				st, err := sb.Wait(ctx)
				if err != nil {
					t.Fatal(err)
				}
				check([]string{"first Wait", "second Wait"}[i], st)
			}
			res, err := sb.Logs(ctx, sbx.LogsOptions{})
			if err != nil {
				t.Fatal(err)
			}
			check("Logs after the Waits", res.Exit)
			// An exec that fails afterwards is not the entrypoint: it is told
			// nothing of the entrypoint's limits.
			if r, err := sb.RunShell(ctx, "exit 1"); err != nil || r.OOMKilled || r.PidsLimitHit {
				t.Errorf("failing exec afterwards: %+v %v; want no limit reported", r, err)
			}
		})
	}
}
