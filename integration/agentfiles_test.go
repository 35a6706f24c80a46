package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestFileUploadsChargedToUserCode: a box's disk is a tmpfs charged to its
// memory, and files written through the agent's file API used to be written
// by the agent, so their pages were charged to the agent's side of the box
// cgroup, outside user code's cgroup. A client (or the box's own code
// calling the API) could thus fill the agent's reserve with uploads, and
// with user code holding the rest of the memory and PID 1's oom_score_adj
// raised to 1000, the box's limit was hit where the agent is the OOM
// killer's first choice: the agent died. Now the data is written by a
// helper in the user cgroups: on the host the box cgroup's own charge (the
// agent's) stays under the reserve after each upload (WriteFile and
// UploadTar), the user cgroup holds the file, an upload that does not fit
// ends in user code's OOM (its holder or the helper killed, a clean error),
// and the agent serves throughout, as does a neighbour.
func TestFileUploadsChargedToUserCode(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	neighbour := newBox(t, ctx, d, sbx.CreateOptions{})
	sb := newBox(t, ctx, d, sbx.CreateOptions{MemoryBytes: 128 << 20, DiskBytes: 96 << 20})
	const reserve = 32 << 20 // the agent's: a quarter of 128 MiB
	usage := func(sub string) int64 {
		t.Helper()
		paths, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/memory/*", sb.ID, sub, "memory.usage_in_bytes"))
		if len(paths) != 1 {
			t.Skipf("no cgroup v1 memory hierarchy for %s (found %v): this test reads v1 files", sb.ID, paths)
		}
		b, err := os.ReadFile(paths[0])
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := mustRun(t, ctx, sb, "echo 1000 > /proc/1/oom_score_adj; cat /proc/1/oom_score_adj"); got != "1000\n" {
		t.Fatalf("raising PID 1's oom_score_adj: got %q, want 1000 (the attack's premise)", got)
	}
	data := bytes.Repeat([]byte("0123456789abcdef"), (80<<20)/16)
	var tarball bytes.Buffer
	tw := tar.NewWriter(&tarball)
	for i, size := range []int{40 << 20, 40 << 20} {
		if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("part%d", i), Mode: 0o644, Size: int64(size), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(data[:size]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	for _, up := range []struct {
		name   string
		upload func(context.Context) error
	}{
		{"WriteFile", func(ctx context.Context) error { return sb.WriteFile(ctx, "/tmp/fill", data, 0o644) }},
		{"UploadTar", func(ctx context.Context) error {
			_, err := sb.UploadTar(ctx, "/tmp/filldir", bytes.NewReader(tarball.Bytes()))
			return err
		}},
	} {
		// User code holds 40 MiB in its cgroup, its score back at 0.
		holdCtx, stopHold := context.WithCancel(ctx)
		held := make(chan struct{})
		go func() {
			defer close(held)
			_, _ = sb.RunShell(holdCtx, `echo 0 > /proc/self/oom_score_adj && exec python3 -c '
a = b"\x01" * (40 << 20)
import time
time.sleep(120)'`)
		}()
		waitUntil(t, 30*time.Second, func() bool { return usage("user") >= 40<<20 },
			func() string { return fmt.Sprintf("user code holds %d bytes, want 40 MiB", usage("user")) })

		uctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := up.upload(uctx)
		cancel()
		t.Logf("%s of 80 MiB while user code holds 40 MiB: %v; box cgroup %d MiB, user cgroup %d MiB",
			up.name, err, usage("")>>20, usage("user")>>20)
		// It fits or ends in user code's OOM; the agent is not the victim.
		if err != nil && !strings.Contains(err.Error(), "in the box's user cgroup") && !strings.Contains(err.Error(), "no space left") {
			t.Errorf("%s of 80 MiB: %v; want it written, or refused by user code's limits (the helper killed, or the disk full)", up.name, err)
		}
		if agentSide := usage("") - usage("user"); agentSide >= reserve {
			t.Errorf("after the %s of 80 MiB the agent's side of the box cgroup holds %d MiB, want under its %d MiB reserve (the file charged to user code)",
				up.name, agentSide>>20, reserve>>20)
		}
		stopHold()
		<-held
		stillServes(t, ctx, d, sb, "after an upload filling the box with PID 1 at oom_score_adj 1000 ("+up.name+")")
		stillServes(t, ctx, d, neighbour, "neighbour after the "+up.name)
		mustRun(t, ctx, sb, "rm -rf /tmp/fill /tmp/filldir; true")
	}
	// User code kills the helper (it is user code's peer): the next write
	// starts another and succeeds.
	if err := sb.WriteFile(ctx, "/tmp/warm", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := mustRun(t, ctx, sb, `n=0; for p in /proc/[0-9]*; do [ "$(tr '\0' ' ' < $p/cmdline 2>/dev/null)" = "sbx-agent sbx-file-writer " ] && kill -9 ${p#/proc/} && n=$((n+1)); done; echo $n`); got != "1\n" {
		t.Fatalf("file writers killed by user code: %q, want 1 (it runs in the box, beside user code)", got)
	}
	if err := sb.WriteFile(ctx, "/tmp/after-kill", []byte("again"), 0o644); err != nil {
		t.Fatalf("write after user code killed the file writer: %v", err)
	}
	if got := mustRun(t, ctx, sb, "cat /tmp/after-kill"); got != "again" {
		t.Errorf("after the file writer was killed, the write reads %q, want \"again\"", got)
	}
}
