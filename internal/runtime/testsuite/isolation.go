package testsuite

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/testutil"
)

// The isolation, limits and leak checks every real driver passes: what a
// box sees of the host, what the host sees of the box's processes, that
// the limits hold, and that nothing of a box is left after Destroy, after
// a crash and after a create cut off by its context. They look at the host
// through runtime.Prober, so each driver answers for its own layout.

// dockerCaps is Docker's default capability set (CHOWN DAC_OVERRIDE
// FOWNER FSETID KILL SETGID SETUID SETPCAP NET_BIND_SERVICE SYS_CHROOT
// AUDIT_WRITE SETFCAP) as /proc/<pid>/status prints it: what user code in
// a box holds, in the box's user namespace or the sandbox kernel.
const dockerCaps = "00000000a00405fb"

// prober returns d's runtime.Prober or fails the test.
func prober(t *testing.T, d runtime.Driver) runtime.Prober {
	t.Helper()
	p, ok := d.(runtime.Prober)
	if !ok {
		t.Fatalf("driver %s does not implement runtime.Prober: the suite cannot look for its leftovers", d.Name())
	}
	return p
}

// leftoversOf lists what d's probe finds left of the boxes ids.
func leftoversOf(t *testing.T, d runtime.Driver, ids ...string) []string {
	t.Helper()
	all, err := prober(t, d).Leftovers(context.Background(), nil)
	if err != nil {
		t.Fatalf("Leftovers: %v", err)
	}
	var out []string
	for _, l := range all {
		for _, id := range ids {
			if l.ID == id {
				out = append(out, l.String())
			}
		}
	}
	return out
}

func checkNothingLeft(t *testing.T, d runtime.Driver, ids ...string) {
	t.Helper()
	if l := leftoversOf(t, d, ids...); len(l) > 0 {
		t.Errorf("left on the host:\n  %s", strings.Join(l, "\n  "))
	}
}

func statusField(status, key string) string {
	for _, line := range strings.Split(status, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// testIsolation: a box sees none of the host's files, processes or
// services; user code holds Docker's capabilities under seccomp with
// no_new_privs; every host process the box is made of runs as an
// unprivileged uid in a user namespace of its own, filtered by seccomp; the
// agent binary cannot be changed from inside.
func testIsolation(t *testing.T, d runtime.Driver, c Config) {
	if c.NoIsolation {
		t.Skipf("driver %s isolates nothing", d.Name())
	}
	secret := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(secret, []byte("s3cret"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A daemon-like service on every host address.
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var reached atomic.Int64
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			reached.Add(1)
			conn.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	h := Create(t, d, c.spec("iso"))
	sh := func(script string) ExecResult {
		t.Helper()
		return MustExec(t, d, h, "/bin/sh", "-c", script)
	}

	t.Run("NoHostFiles", func(t *testing.T) {
		c.skip(t)
		if r := sh("cat " + secret); r.ExitCode == 0 || strings.Contains(r.Stdout, "s3cret") {
			t.Errorf("cat %s in the box: %+v, want it missing", secret, r)
		}
		if r := sh("ls -A /root /home"); r.Stdout != "/home:\n\n/root:\n" {
			t.Errorf("ls -A /root /home: got %q, want two empty dirs", r.Stdout)
		}
		for _, p := range []string{"/etc/shadow", "/etc/ssh", "/etc/machine-id", "/etc/sudoers", "/etc/ssl/private"} {
			if r := sh("ls -d " + p); r.ExitCode == 0 {
				t.Errorf("host path %s is visible in the box: %q", p, r.Stdout)
			}
		}
	})
	t.Run("NoHostProcesses", func(t *testing.T) {
		c.skip(t)
		self := strconv.Itoa(os.Getpid())
		r := sh(`for p in /proc/[0-9]*; do echo "${p#/proc/} $(tr '\0' ' ' < $p/cmdline)"; done`)
		lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
		if len(lines) > 5 {
			t.Errorf("box sees %d processes, want only its own:\n%s", len(lines), r.Stdout)
		}
		if !strings.HasPrefix(r.Stdout, "1 /.sbx/sbx-agent") {
			t.Errorf("pid 1 in the box: got %q, want the agent", lines[0])
		}
		if r := sh("cat /proc/" + self + "/cmdline"); strings.Contains(r.Stdout, ".test") {
			t.Errorf("the test binary (host pid %s) is visible in the box: %q", self, r.Stdout)
		}
	})
	t.Run("NoHostServices", func(t *testing.T) {
		c.skip(t)
		addrs := []string{"127.0.0.1"}
		ifs, _ := net.InterfaceAddrs()
		for _, a := range ifs {
			if ip, ok := a.(*net.IPNet); ok && ip.IP.To4() != nil && !ip.IP.IsLoopback() {
				addrs = append(addrs, ip.IP.String())
			}
		}
		script := fmt.Sprintf(`
import socket
for a in %q.split():
    try:
        socket.create_connection((a, %d), 2).close()
        print("reached", a)
    except OSError:
        pass
`, strings.Join(addrs, " "), port)
		if r := MustExec(t, d, h, "/usr/bin/python3", "-c", script); r.Stdout != "" || r.ExitCode != 0 {
			t.Errorf("connecting to a host service on %v from the box: %+v, want nothing reached", addrs, r)
		}
		if n := reached.Load(); n > 0 {
			t.Errorf("the host service saw %d connections from the box, want none", n)
		}
		if r := sh("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"); r.Stdout != "lo\n" {
			t.Errorf("network interfaces: got %q, want only lo", r.Stdout)
		}
	})
	t.Run("CapabilitiesSeccompInBox", func(t *testing.T) {
		c.skip(t)
		status := sh("cat /proc/self/status").Stdout
		for _, k := range []string{"CapEff", "CapPrm", "CapBnd"} {
			if got := statusField(status, k); got != dockerCaps {
				t.Errorf("user code's %s = %q, want %s (Docker's set)", k, got, dockerCaps)
			}
		}
		if got := statusField(status, "Seccomp"); got != "2" {
			t.Errorf("user code's Seccomp = %q, want 2 (filter)", got)
		}
		if got := statusField(status, "NoNewPrivs"); got != "1" {
			t.Errorf("user code's NoNewPrivs = %q, want 1", got)
		}
		// The filter is the box's: new user namespaces are refused.
		if r := sh("unshare -U true 2>/dev/null && echo unshared"); strings.Contains(r.Stdout, "unshared") {
			t.Errorf("unshare -U succeeded in the box")
		}
		// Refused syscalls fail with the profile's errno, not always EPERM:
		// clone3 must be ENOSYS, or libc does not fall back to clone and no
		// thread starts (runsc's own OCI seccomp returns EPERM for every
		// rule: every threaded program failed on gvisor).
		threads := `import ctypes, errno, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall(435, 0, 0)
e = ctypes.get_errno()
t = threading.Thread(target=print, args=("thread",))
t.start()
t.join()
print(errno.errorcode.get(e, e))`
		if r := MustExec(t, d, h, "/usr/bin/python3", "-c", threads); r.Stdout != "thread\nENOSYS\n" || r.ExitCode != 0 {
			t.Errorf("a thread and clone3's errno in the box: got %q (stderr %q, exit %d), want \"thread\\nENOSYS\\n\"", r.Stdout, r.Stderr, r.ExitCode)
		}
	})
	t.Run("HostProcessesConfined", func(t *testing.T) {
		c.skip(t)
		pids, err := prober(t, d).HostPids(context.Background(), h)
		if err != nil || len(pids) == 0 {
			t.Fatalf("HostPids = %v, %v; want the box's host processes", pids, err)
		}
		hostNS, _ := os.ReadFile("/proc/self/uid_map")
		for _, pid := range pids {
			status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			if err != nil {
				continue // gone meanwhile
			}
			name := statusField(string(status), "Name")
			for i, u := range strings.Fields(statusField(string(status), "Uid")) {
				if u == "0" {
					t.Errorf("host process %d (%s) has host uid 0 (Uid field %d)", pid, name, i)
				}
			}
			if got := statusField(string(status), "Seccomp"); got != "2" {
				t.Errorf("host process %d (%s): Seccomp = %q, want 2", pid, name, got)
			}
			if m, err := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", pid)); err == nil && bytes.Equal(m, hostNS) {
				t.Errorf("host process %d (%s) is in the host's user namespace (uid_map %q)", pid, name, m)
			}
		}
	})
	t.Run("AgentImmutable", func(t *testing.T) {
		c.skip(t)
		before, _ := os.ReadFile(testutil.AgentBinary(t))
		for _, script := range []string{"echo x > /.sbx/sbx-agent", "cp /bin/true /.sbx/sbx-agent", "rm -f /.sbx/sbx-agent", "mv /.sbx /sbx2"} {
			if r := sh(script); r.ExitCode == 0 {
				t.Errorf("%q succeeded in the box", script)
			}
		}
		// Whatever box root can remove under /.sbx (gvisor: the agent's
		// socket files in /.sbx/run, which runsc's gofer makes on the host),
		// the daemon still reaches the agent (attack class 5).
		MustExec(t, d, h, "/bin/sh", "-c", "rm -rf /.sbx/run/* /.sbx/*.sock 2>/dev/null; true")
		if err := Hello(ctxT(t), d, h); err != nil {
			t.Errorf("Hello after box root removed what it could under /.sbx: %v", err)
		}
		if r := sh("test -x /.sbx/sbx-agent && echo ok"); r.Stdout != "ok\n" {
			t.Errorf("the agent binary after the attempts: %+v", r)
		}
		if after, _ := os.ReadFile(testutil.AgentBinary(t)); !bytes.Equal(before, after) {
			t.Errorf("the agent binary on the host changed")
		}
	})
}

// testMemoryBound: a process allocating past the box's memory limit does
// not get the memory. With CapProcessLimits only it dies: the agent keeps
// serving and Stats counts the kill. Either way nothing is left after.
func testMemoryBound(t *testing.T, d runtime.Driver, c Config) {
	if c.NoIsolation {
		t.Skipf("driver %s isolates nothing", d.Name())
	}
	ctx := ctxT(t)
	spec := c.spec("hog")
	spec.Resources.MemoryBytes = 128 << 20
	spec.Resources.DiskBytes = 16 << 20
	h := Create(t, d, spec)
	hog := "b = bytearray(512 << 20); b[::4096] = b'x' * len(b[::4096]); print('allocated')"
	r, err := Exec(ctx, d, h, "/usr/bin/python3", "-c", hog)
	if err == nil && (r.ExitCode == 0 || strings.Contains(r.Stdout, "allocated")) {
		t.Fatalf("512 MiB hog in a 128 MiB box: %+v, want it killed", r)
	}
	if HasCapability(d, runtime.CapProcessLimits) {
		if err != nil {
			t.Fatalf("exec of the hog: %v, want the hog killed and the box serving", err)
		}
		if err := Hello(ctx, d, h); err != nil {
			t.Errorf("agent after the hog: %v", err)
		}
		if HasCapability(d, runtime.CapStats) {
			if st, err := d.Stats(ctx, h); err != nil || st.OOMKills < 1 {
				t.Errorf("Stats after the hog: %+v, %v; want OOMKills >= 1", st, err)
			}
		}
	} else {
		t.Logf("hog (the box as a whole is bounded): %+v, %v", r, err)
	}
	if err := d.Destroy(ctx, h); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	checkNothingLeft(t, d, h.ID)
}

// forkPy forks children that sleep until the fork fails (or 1000 are
// made) and prints how many it made: a bomb that holds every pid it gets.
const forkPy = `
import os, time
n = 0
while n < 1000:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(5)
        os._exit(0)
    n += 1
print(n)
`

// testForkBomb: a process that takes every pid it can is stopped by the
// box's pids limit, and the box serves again once its children end.
func testForkBomb(t *testing.T, d runtime.Driver, c Config) {
	spec := c.spec("bomb")
	spec.Resources.Pids = 64
	h := Create(t, d, spec)
	r := MustExec(t, d, h, "/usr/bin/python3", "-c", forkPy)
	n, err := strconv.Atoi(strings.TrimSpace(r.Stdout))
	if err != nil || n >= int(spec.Resources.Pids) {
		t.Fatalf("fork bomb in a box of %d pids: made %q children (%+v), want it stopped below the limit", spec.Resources.Pids, r.Stdout, r)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := Exec(ctxT(t), d, h, "echo", "alive")
		if err == nil && res.Stdout == "alive\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("box does not answer after the fork bomb: %+v %v", res, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// testDiskBound: the disk limit bounds writes anywhere in the box's own
// tree (/tmp included, which a runtime may otherwise put on a tmpfs of its
// own) and Stats reports the use.
func testDiskBound(t *testing.T, d runtime.Driver, c Config) {
	spec := c.spec("disk")
	spec.Resources.DiskBytes = 32 << 20
	h := Create(t, d, spec)
	for _, dir := range []string{"/tmp", "/root"} {
		r := MustExec(t, d, h, "dd", "if=/dev/zero", "of="+dir+"/fill", "bs=1M", "count=100")
		if r.ExitCode == 0 || !strings.Contains(r.Stderr, "No space left on device") {
			t.Errorf("dd of 100 MiB into %s of a 32 MiB disk: exit %d stderr %q, want ENOSPC", dir, r.ExitCode, r.Stderr)
		}
		if dir == "/tmp" && HasCapability(d, runtime.CapStats) {
			if st, err := d.Stats(ctxT(t), h); err != nil || st.DiskUsedBytes < 16<<20 || st.DiskUsedBytes > 33<<20 {
				t.Errorf("Stats.DiskUsedBytes = %d (%v), want about 32 MiB", st.DiskUsedBytes, err)
			}
		}
		MustExec(t, d, h, "rm", "-f", dir+"/fill")
	}
}

// testNothingLeftAfterDestroy: boxes destroyed while idle, with processes
// of their own running, and paused leave nothing on the host.
func testNothingLeftAfterDestroy(t *testing.T, d runtime.Driver, c Config) {
	ctx := ctxT(t)
	var ids []string
	for i := range 3 {
		h, err := d.Create(ctx, c.spec("leak"))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, h.ID)
		switch {
		case i == 1:
			MustExec(t, d, h, "/bin/sh", "-c", "sleep 100 & sleep 100 & echo started")
		case i == 2 && HasCapability(d, runtime.CapPause):
			if err := d.Pause(ctx, h); err != nil {
				t.Fatal(err)
			}
		}
		if err := d.Destroy(ctx, h); err != nil {
			t.Fatalf("Destroy: %v", err)
		}
	}
	checkNothingLeft(t, d, ids...)
}

// testNothingLeftAfterCrash: a box the daemon lost track of (it crashed
// and its record is gone) is removed completely by the next daemon's
// Cleanup.
func testNothingLeftAfterCrash(t *testing.T, d runtime.Driver, c Config) {
	ctx := ctxT(t)
	h, err := d.Create(ctx, c.spec("crash"))
	if err != nil {
		t.Fatal(err)
	}
	MustExec(t, d, h, "/bin/sh", "-c", "sleep 100 & echo started")
	d2 := c.NewDriver(t) // the daemon restarted, knowing no box
	// The probe sees the box while it exists (else the check below
	// would prove nothing): its dir, cgroups, processes...
	if l := leftoversOf(t, d2, h.ID); len(l) == 0 {
		t.Fatalf("Leftovers lists nothing of live box %s not kept", h.ID)
	} else {
		t.Logf("before Cleanup, the probe sees: %v", l)
	}
	if err := d2.Cleanup(ctx, map[string]bool{}); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	checkNothingLeft(t, d2, h.ID)
}

// testCreateCutOff: a create cut off by its context at any point leaves
// nothing behind (the driver rolls back, or the box exists and Destroy
// removes it).
func testCreateCutOff(t *testing.T, d runtime.Driver, c Config) {
	var ids []string
	for _, after := range []time.Duration{time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond, 60 * time.Millisecond, 120 * time.Millisecond} {
		spec := c.spec("cut")
		ids = append(ids, spec.ID)
		ctx, cancel := context.WithTimeout(context.Background(), after)
		h, err := d.Create(ctx, spec)
		cancel()
		if err == nil {
			if err := d.Destroy(context.Background(), h); err != nil {
				t.Fatalf("Destroy: %v", err)
			}
		}
	}
	checkNothingLeft(t, d, ids...)
}
