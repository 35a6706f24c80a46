package integration

import (
	"context"
	"testing"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestFileWriterStoppedByUserCode: the agent's file writer helper is user
// code's peer, so user code can stop it (SIGSTOP) as well as kill it. A
// stopped helper took the agent's next write request and never answered:
// the write hung until its caller gave up, and so did every later one
// handed to it. Now the agent waits a bounded time for the helper to take
// a request, drops one that does not, and writes through a new helper.
func TestFileWriterStoppedByUserCode(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	sb := newBox(t, ctx, d, sbx.CreateOptions{})
	if err := sb.WriteFile(ctx, "/tmp/first", []byte("x"), 0o644); err != nil {
		t.Fatal(err) // starts the helper, which then idles for a while
	}
	if got := mustRun(t, ctx, sb, `n=0; for p in /proc/[0-9]*; do [ "$(tr '\0' ' ' < $p/cmdline 2>/dev/null)" = "sbx-agent sbx-file-writer " ] && kill -STOP ${p#/proc/} && n=$((n+1)); done; echo $n`); got != "1\n" {
		t.Fatalf("file writers stopped by user code: %q, want 1", got)
	}
	for i := range 3 {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		start := time.Now()
		err := sb.WriteFile(wctx, "/tmp/after-stop", []byte("again"), 0o644)
		cancel()
		if err != nil {
			t.Fatalf("write %d after user code stopped the file writer: %v (after %v)", i, err, time.Since(start).Round(time.Millisecond))
		}
		t.Logf("write %d after the stop took %v", i, time.Since(start).Round(time.Millisecond))
	}
	if got := mustRun(t, ctx, sb, "cat /tmp/after-stop"); got != "again" {
		t.Errorf("after the file writer was stopped, the write reads %q, want \"again\"", got)
	}
}
