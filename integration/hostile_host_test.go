package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sbxdev/sbx/internal/testutil"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// What one default sandbox can do to the host and its neighbours through
// what the kernel shares between them: the file table, device nodes, and
// what /proc and /sys show of the host.

// fdAttack forks 16 processes that each open /dev/null until the kernel
// says no (EMFILE at the box's RLIMIT_NOFILE, ENFILE at fs.file-max), report
// how many they got and why they stopped, then hold them, detached, until
// /tmp/stop exists or 10 s have passed. Creating the report needs no new
// file (it goes through a pipe and the exec's stdout).
const fdAttack = `cat > /tmp/fd.py <<'EOF'
import os, time
N = 16
stop = time.time() + 10
r, w = os.pipe()
for i in range(N):
    if os.fork() == 0:
        os.setsid()
        n, err = 0, 0
        try:
            while True:
                os.open("/dev/null", os.O_RDONLY)
                n += 1
        except OSError as e:
            err = e.errno
        os.write(w, ("%d %d\n" % (n, err)).encode())
        while time.time() < stop and not os.path.isdir("/tmp/stop"):
            time.sleep(0.05)
        os._exit(0)
buf = b""
while buf.count(b"\n") < N:
    buf += os.read(r, 4096)
print(buf.decode(), end="")
EOF
python3 /tmp/fd.py`

// describe says how an exec ended (res may be nil).
func describe(res *sbx.Result) string {
	if res == nil {
		return "no result"
	}
	return fmt.Sprintf("exit %d, stderr %q", res.Code, res.Stderr)
}

// fileNr is fs.file-nr's allocated count and fs.file-max.
func fileNr(t *testing.T) (allocated, max int64) {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/fs/file-nr")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	allocated, _ = strconv.ParseInt(f[0], 10, 64)
	max, _ = strconv.ParseInt(f[2], 10, 64)
	return allocated, max
}

// hostNobodyOpens runs cat as nobody on the host: a process with no
// privilege over the file table (root may go past fs.file-max).
func hostNobodyOpens() error {
	out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", "/etc/hostname").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}

// boxMemory is the box's memory cgroup usage and kernel-memory part
// (cgroup v1; zeros elsewhere).
func boxMemory(id string) (usage, kmem int64) {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/memory/sbx*/" + id)
	if len(dirs) != 1 {
		return 0, 0
	}
	read := func(f string) int64 {
		b, _ := os.ReadFile(filepath.Join(dirs[0], f))
		n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return n
	}
	return read("memory.usage_in_bytes"), read("memory.kmem.usage_in_bytes")
}

// TestFileTableExhaustion: fs.file-max is one host-wide counter that
// namespaces and cgroups do not split; two default boxes opening files as
// fast as they can used to take all of it, and then the neighbours, host
// users and the daemon's own box creation failed with ENFILE. The host
// starts at a stock-looking fs.file-max (what is in use plus 200,000, so the
// attack takes well under 10 s on the old code); the daemon makes struct
// files a per-box cost that each box's memory limit bounds. While two boxes
// hold all they can open, and after they stop, a neighbour box can exec, a
// non-root host process can open a file and the daemon can create a box.
func TestFileTableExhaustion(t *testing.T) {
	testutil.RequiresRoot(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("needs setpriv (util-linux)")
	}
	orig, err := os.ReadFile("/proc/sys/fs/file-max")
	if err != nil {
		t.Fatal(err)
	}
	inUse, _ := fileNr(t)
	headroom := int64(200_000)
	if err := os.WriteFile("/proc/sys/fs/file-max", []byte(strconv.FormatInt(inUse+headroom, 10)), 0); err != nil {
		t.Skipf("cannot set fs.file-max: %v", err)
	}
	t.Cleanup(func() { _ = os.WriteFile("/proc/sys/fs/file-max", orig, 0) })

	d := startDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	attackers := []*sbx.Sandbox{newBox(t, ctx, d, sbx.CreateOptions{}), newBox(t, ctx, d, sbx.CreateOptions{})}
	neighbour := newBox(t, ctx, d, sbx.CreateOptions{})
	_, fileMax := fileNr(t)
	t.Logf("fs.file-max after the daemon started: %d (set to %d before)", fileMax, inUse+headroom)

	var wg sync.WaitGroup
	opened := make([]int64, len(attackers))
	stops := make([]map[string]int, len(attackers))
	errs := make([]error, len(attackers))
	t0 := time.Now()
	for i, sb := range attackers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := sb.RunShell(ctx, fdAttack)
			if err != nil || res.Code != 0 {
				errs[i] = fmt.Errorf("attack in %s: %v, %s", sb.ID, err, describe(res))
				return
			}
			stops[i] = map[string]int{}
			for _, line := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n") {
				var n, errno int
				fmt.Sscan(line, &n, &errno)
				opened[i] += int64(n)
				stops[i][syscall.Errno(errno).Error()]++
			}
		}()
	}
	wg.Wait()
	attackTime := time.Since(t0)
	allocated, _ := fileNr(t)
	for i, sb := range attackers {
		usage, kmem := boxMemory(sb.ID)
		t.Logf("box %s: %d files open by 16 processes (stopped by %v), memory cgroup usage %d MiB (kmem %d MiB); %v",
			sb.ID, opened[i], stops[i], usage>>20, kmem>>20, errs[i])
		// What makes the box's memory limit their bound: each struct file
		// (≈ 200 bytes of filp slab and fd table) is charged to the box.
		if usage > 0 && kmem < opened[i]*150 {
			t.Errorf("box %s: kmem %d bytes for %d open files, want at least 150 bytes a file charged to the box", sb.ID, kmem, opened[i])
		}
	}
	t.Logf("attack took %v; host file table: %d allocated of %d", attackTime.Round(time.Millisecond), allocated, fileMax)

	// Each check has 4 s (they take milliseconds on an idle host): on the
	// old code the neighbour's exec and the daemon's create waited, their
	// accept loops backing off, until the attack ended 10 s after it began.
	check := func(when string) {
		t.Helper()
		if err := hostNobodyOpens(); err != nil {
			t.Errorf("%s: a non-root host process cannot open a file: %v", when, err)
		}
		cctx, cancel := context.WithTimeout(ctx, 4*time.Second)
		defer cancel()
		if res, err := neighbour.RunShell(cctx, "cat /etc/hostname >/dev/null"); err != nil || res.Code != 0 {
			t.Errorf("%s: the neighbour cannot exec: %v, %s", when, err, describe(res))
		}
		cctx, cancel = context.WithTimeout(ctx, 4*time.Second)
		defer cancel()
		sb, err := d.client().Create(cctx, sbx.CreateOptions{})
		if err != nil {
			t.Errorf("%s: the daemon cannot create a box: %v", when, err)
			return
		}
		d.remember(sb.ID)
		_ = sb.Destroy(context.WithoutCancel(ctx))
	}
	check("while two boxes hold every file they could open")
	for i, err := range errs {
		if err != nil {
			t.Errorf("attacker %d: %v", i, err)
		}
	}
	if total := opened[0] + opened[1]; fileMax <= inUse+headroom || total <= headroom {
		t.Errorf("got %d files opened by the two boxes and fs.file-max %d, want more than the %d the host had room for (the file table no longer the bound)",
			total, fileMax, headroom)
	}

	for _, sb := range attackers {
		_, _ = sb.RunShell(ctx, "mkdir -p /tmp/stop") // may fail on a starved host; the attack ends by itself anyway
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if allocated, _ = fileNr(t); allocated < inUse+headroom/4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the attack's files are still open: %d allocated (%d before)", allocated, inUse)
		}
		time.Sleep(50 * time.Millisecond)
	}
	check("after the attack")
}

// fuseStat is what one stat shows of a /dev/fuse node.
func fuseStat(t *testing.T, ctx context.Context, sb *sbx.Sandbox) string {
	t.Helper()
	return mustRun(t, ctx, sb, "stat -c '%a %u:%g %Y %t:%T' /dev/fuse")
}

// TestFuseDevicePerBox: every box used to get a bind of one host /dev/fuse
// node that box root owned: chmod, chown and touch in one box showed in all
// the others and stayed on the host (a channel between tenants). Each box
// now has a node of its own; the host's /dev/fuse is never bound.
func TestFuseDevicePerBox(t *testing.T) {
	testutil.RequiresRoot(t)
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	var host syscall.Stat_t
	if err := syscall.Stat("/dev/fuse", &host); err != nil {
		t.Skipf("no /dev/fuse on the host: %v", err)
	}
	a := newBox(t, ctx, d, sbx.CreateOptions{})
	b := newBox(t, ctx, d, sbx.CreateOptions{})
	beforeB := fuseStat(t, ctx, b)
	if !strings.HasSuffix(beforeB, " a:e5\n") {
		t.Fatalf("/dev/fuse in a box: %q, want the FUSE device (10:229)", beforeB)
	}
	mustRun(t, ctx, a, "chmod 0666 /dev/fuse && chown 1234:1234 /dev/fuse && touch -d '2001-01-01 00:00' /dev/fuse")
	if got := fuseStat(t, ctx, a); !strings.HasPrefix(got, "666 1234:1234 978307200 ") {
		t.Fatalf("box A's own /dev/fuse after chmod, chown, touch: %q", got)
	}
	if got := fuseStat(t, ctx, b); got != beforeB {
		t.Errorf("box B's /dev/fuse after box A changed its own: got %q, want %q", got, beforeB)
	}
	var after syscall.Stat_t
	if err := syscall.Stat("/dev/fuse", &after); err != nil {
		t.Fatal(err)
	}
	if after.Mode != host.Mode || after.Uid != host.Uid || after.Gid != host.Gid || after.Mtim != host.Mtim {
		t.Errorf("host /dev/fuse changed: mode %o %d:%d mtime %v, was %o %d:%d %v",
			after.Mode, after.Uid, after.Gid, after.Mtim, host.Mode, host.Uid, host.Gid, host.Mtim)
	}
	// A box created after the change gets a pristine node too.
	c := newBox(t, ctx, d, sbx.CreateOptions{})
	if got := fuseStat(t, ctx, c); got != beforeB && !strings.HasPrefix(got, "600 0:0 ") {
		t.Errorf("a new box's /dev/fuse: got %q, want mode 600 owned by its root", got)
	}
}

// TestHostInfoHidden: what a default box could read of the host and of
// other tenants: the kernel command line and configuration, the crash
// kernel's notes, the backing files of loop devices (other tenants' volume
// paths), the host's swap files, and — in its own mountinfo — the daemon's
// data directory and the box id in the overlay options and bind sources.
func TestHostInfoHidden(t *testing.T) {
	testutil.RequiresRoot(t)
	d := startDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	c := d.client()
	if _, err := c.CreateVolume(ctx, "tenant", 16<<20); err != nil {
		t.Fatal(err)
	}
	// After the boxes (cleanups run last first): volumes outlive daemons.
	t.Cleanup(func() {
		if err := c.RemoveVolume(context.Background(), "tenant"); err != nil {
			t.Errorf("remove volume: %v", err)
		}
	})
	owner := newBox(t, ctx, d, sbx.CreateOptions{Volumes: []sbx.VolumeMount{{Volume: "tenant", Path: "/data"}}})
	other := newBox(t, ctx, d, sbx.CreateOptions{})
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte("package main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateCodebase(ctx, src, sbx.UploadOptions{Name: "hostinfo"}); err != nil {
		t.Fatal(err)
	}
	coder := codebaseSandbox(t, ctx, d, "hostinfo", 0)

	for _, p := range []string{"/proc/cmdline", "/proc/config.gz", "/sys/kernel/vmcoreinfo", "/proc/swaps"} {
		res, err := other.RunShell(ctx, "cat "+p+" 2>/dev/null | wc -c")
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(res.Stdout)); got != "0" {
			t.Errorf("%s in a box: %s bytes readable, want none", p, got)
		}
	}
	// Every way sysfs names a block device leads to the same directory.
	leak := mustRun(t, ctx, other, `for f in /sys/block/*/loop/backing_file /sys/class/block/*/loop/backing_file /sys/dev/block/*/loop/backing_file \
		$(find /sys -name backing_file 2>/dev/null); do cat "$f" 2>/dev/null; done; echo end`)
	if strings.Contains(leak, d.dataDir) || strings.Contains(leak, "/") {
		t.Errorf("loop backing files readable in a neighbour box:\n%s", leak)
	}
	for _, sb := range []*sbx.Sandbox{owner, other, coder} {
		mi := mustRun(t, ctx, sb, "cat /proc/self/mountinfo")
		for _, s := range []string{d.dataDir, sb.ID, owner.ID, other.ID, coder.ID, src} {
			if strings.Contains(mi, s) {
				t.Errorf("/proc/self/mountinfo of %s shows %q:\n%s", sb.ID, s, mi)
			}
		}
	}
	// The box still works as a box: its volume, its FUSE device, its sysfs.
	mustRun(t, ctx, owner, "echo x > /data/f && test -c /dev/fuse && test -d /sys/class/net/lo")
	mustRun(t, ctx, coder, "grep -q 'package main' /workspace/main.go")
}
