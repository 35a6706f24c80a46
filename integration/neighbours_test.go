package integration

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// newBox creates a sandbox that is destroyed with the test.
func newBox(t *testing.T, ctx context.Context, d *daemon, opts sbx.CreateOptions) *sbx.Sandbox {
	t.Helper()
	sb, err := d.client().Create(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	return sb
}

// execWorks runs a few commands with a bounded wait: a box whose agent
// stopped accepting would hang, not fail.
func execWorks(t *testing.T, sb *sbx.Sandbox, what string) {
	t.Helper()
	for i := 0; i < 10; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		res, err := sb.Run(ctx, "true")
		cancel()
		if err != nil || res.Code != 0 {
			t.Fatalf("%s: exec %d in %s: %v %v", what, i, sb.ID, res, err)
		}
	}
}

// TestAgentOutOfUserCodesReach: user code (root in the box, the agent's own
// uid) cannot lower the agent's resource limits with prlimit, which used to
// end its exec accept loop for good; its own processes run with all uids 0.
func TestAgentOutOfUserCodesReach(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	sb := newBox(t, ctx, d, sbx.CreateOptions{})
	for _, lim := range []string{"NOFILE", "NPROC", "AS"} {
		res, err := sb.RunShell(ctx, `python3 -c "
import resource, sys
try:
    resource.prlimit(1, resource.RLIMIT_`+lim+`, (4, 4))
except PermissionError:
    sys.exit(0)
sys.exit('prlimit on the agent succeeded')
"`)
		if err != nil || res.Code != 0 {
			t.Errorf("prlimit RLIMIT_%s of PID 1: %v, exit %d, stderr %q", lim, err, res.Code, res.Stderr)
		}
	}
	execWorks(t, sb, "after prlimit attempts")
	if got := mustRun(t, ctx, sb, "grep -E '^(Uid|Gid):' /proc/self/status | tr -s '\\t ' ' '"); got != "Uid: 0 0 0 0\nGid: 0 0 0 0\n" {
		t.Errorf("user process ids: %q", got)
	}
}

// TestNoVsock: AF_VSOCK ignores network namespaces, so a box could bind
// ports that collide with the host's and other boxes'. socket(AF_VSOCK) (and
// other families sandboxes do not need) fails; the usual families work.
func TestNoVsock(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	sb := newBox(t, ctx, d, sbx.CreateOptions{})
	out := mustRun(t, ctx, sb, `python3 -c "
import socket
for name in ['AF_VSOCK', 'AF_ALG', 'AF_UNIX', 'AF_INET', 'AF_INET6', 'AF_NETLINK']:
    fam = getattr(socket, name)
    try:
        socket.socket(fam, socket.SOCK_DGRAM if name in ('AF_NETLINK',) else (socket.SOCK_SEQPACKET if name == 'AF_ALG' else socket.SOCK_STREAM)).close()
        print(name, 'ok')
    except OSError as e:
        print(name, e.errno)
"`)
	want := "AF_VSOCK 1\nAF_ALG 1\nAF_UNIX ok\nAF_INET ok\nAF_INET6 ok\nAF_NETLINK ok\n"
	if out != want {
		t.Errorf("socket families in a box:\n%s\nwant:\n%s", out, want)
	}
	if strings.Contains(out, "AF_VSOCK ok") {
		t.Error("a box can open vsock sockets")
	}
}

// TestHugeRequestsRefused: requests past the daemon's bounds get a clear
// InvalidArgument (they used to be accepted — 100k labels took 18 s and
// 515 MB — or gave a 500), and limits past what the host has are refused.
func TestHugeRequestsRefused(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	c := d.client()
	many := func(n int) map[string]string {
		m := make(map[string]string, n)
		for i := range n {
			m[fmt.Sprintf("k%d", i)] = "v"
		}
		return m
	}
	cidrs := make([]string, 100_000)
	for i := range cidrs {
		cidrs[i] = fmt.Sprintf("203.0.%d.%d/32", i/256%256, i%256)
	}
	for _, tc := range []struct {
		name string
		opts sbx.CreateOptions
		want string
	}{
		{"100k labels", sbx.CreateOptions{Labels: many(100_000)}, "labels: 100000 given"},
		{"100k env vars", sbx.CreateOptions{Env: many(100_000)}, "100000 environment variables"},
		{"100k arguments", sbx.CreateOptions{Command: make([]string, 100_000)}, "100000 arguments"},
		{"10k-byte workdir", sbx.CreateOptions{Workdir: "/" + strings.Repeat("w", 10_000)}, "workdir: 10001 bytes"},
		{"100k allow cidrs", sbx.CreateOptions{Network: &sbx.NetworkPolicy{Mode: "allow", AllowCIDRs: cidrs}}, "allow_cidrs: 100000 entries"},
		{"pids above the host", sbx.CreateOptions{Pids: 1 << 22}, "above this host's maximum"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Create(ctx, tc.opts)
			wantCode(t, tc.name, err, connect.CodeInvalidArgument)
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
	sb := newBox(t, ctx, d, sbx.CreateOptions{})
	_, err := sb.Run(ctx, append([]string{"true"}, make([]string, 100_000)...)...)
	wantCode(t, "exec with 100k arguments", err, connect.CodeInvalidArgument)
	if list, err := c.List(ctx); err != nil || len(list) != 1 {
		t.Errorf("list after refused creates: %d sandboxes, %v", len(list), err)
	}
}

// TestDiskFillCannotKillAgent: a default box's disk is held in its memory;
// filling it used to OOM-kill the agent and leave a running box that could
// not exec. The default disk now fits the memory and a disk that cannot is
// refused at create.
func TestDiskFillCannotKillAgent(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	c := d.client()
	_, err := c.Create(ctx, sbx.CreateOptions{MemoryBytes: 512 << 20, DiskBytes: 1 << 30})
	wantCode(t, "disk above memory", err, connect.CodeInvalidArgument)
	if !strings.Contains(err.Error(), "at most 448MiB with memory 512MiB") {
		t.Errorf("error does not say the bound: %v", err)
	}
	sb := newBox(t, ctx, d, sbx.CreateOptions{})
	if got := sb.Info.GetResources().GetDiskBytes(); got != 448<<20 {
		t.Errorf("default disk %d, want 448 MiB", got)
	}
	res, err := sb.RunShell(ctx, "dd if=/dev/urandom of=/tmp/fill bs=1M status=none; echo dd=$?; df -k / | tail -1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(res.Stdout), "dd=1") {
		t.Errorf("filling the disk: %q %q (want dd to stop at the disk limit)", res.Stdout, res.Stderr)
	}
	execWorks(t, sb, "with a full disk")
	mustRun(t, ctx, sb, "rm /tmp/fill")
	execWorks(t, sb, "after freeing the disk")
}

// TestEntrypointOutputNotOnHostDisk: a sandbox's own command writing 60 MB
// used to fill a host file (agent.log) with no cap, whatever the box's disk
// limit; its output now stays in the agent's bounded buffer.
func TestEntrypointOutputNotOnHostDisk(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	sb := newBox(t, ctx, d, sbx.CreateOptions{DiskBytes: 16 << 20, Command: []string{"sh", "-c", "head -c 60000000 /dev/zero | tr '\\0' x; echo done > /tmp/flooded; sleep 600"}})
	for {
		res, err := sb.RunShell(ctx, "cat /tmp/flooded 2>/dev/null")
		if err != nil {
			t.Fatal(err)
		}
		if string(res.Stdout) == "done\n" {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the flood did not finish")
		case <-time.After(100 * time.Millisecond):
		}
	}
	var total int64
	_ = filepath.WalkDir(filepath.Join(d.dataDir, "oci"), func(p string, de fs.DirEntry, err error) error {
		if err == nil && de.Type().IsRegular() && strings.HasSuffix(p, ".log") {
			if fi, err := de.Info(); err == nil {
				total += fi.Size()
			}
		}
		return nil
	})
	if total > 1<<20 {
		t.Errorf("a box's 60 MB of output left %d bytes of logs on the host", total)
	}
	execWorks(t, sb, "after the flood")
}

// TestOOMKillReported: a command killed by the sandbox's memory limit says
// so (its exit looked like any other SIGKILL before); one killed by a plain
// SIGKILL does not, and the box still answers.
func TestOOMKillReported(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	sb := newBox(t, ctx, d, sbx.CreateOptions{MemoryBytes: 64 << 20, DiskBytes: 16 << 20})
	res, err := sb.RunShell(ctx, "python3 -c 'b = bytearray(256 << 20); print(len(b))'")
	if err != nil {
		t.Fatal(err)
	}
	if res.Code != 137 || !res.OOMKilled {
		t.Errorf("memory hog: exit %d, oom_killed %v; want 137 and true", res.Code, res.OOMKilled)
	}
	res, err = sb.RunShell(ctx, "kill -9 $$")
	if err != nil {
		t.Fatal(err)
	}
	if res.Code != 137 || res.OOMKilled {
		t.Errorf("kill -9: exit %d, oom_killed %v; want 137 and false", res.Code, res.OOMKilled)
	}
	_, errOut, code := d.cli("", "exec", sb.ID, "--", "python3", "-c", "b = bytearray(256 << 20)")
	if code != 137 || !strings.Contains(errOut, "killed by the memory limit (OOM)") {
		t.Errorf("sbx exec of a memory hog: exit %d, stderr %q", code, errOut)
	}
	execWorks(t, sb, "after OOM kills")
}
