//go:build linux

package oci_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/testsuite"
	"github.com/sbxdev/sbx/internal/testutil"
)

// initPid is the box init's host pid, from the handle.
func initPid(t *testing.T, h runtime.Handle) int {
	t.Helper()
	var data struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(h.Data, &data); err != nil || data.Pid == 0 {
		t.Fatalf("handle data %s: no pid (%v)", h.Data, err)
	}
	return data.Pid
}

func statusField(t *testing.T, status, key string) string {
	t.Helper()
	for _, line := range strings.Split(status, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == key {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %s in status:\n%s", key, status)
	return ""
}

func TestIsolation(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := stateRoot(t)
	d := newDriver(t, dir)
	h := testsuite.Create(t, d, testsuite.NewSpec("iso"))
	sh := func(script string) testsuite.ExecResult {
		t.Helper()
		return testsuite.MustExec(t, d, h, "/bin/sh", "-c", script)
	}

	t.Run("ProcSysReadOnly", func(t *testing.T) {
		for _, f := range []string{"/proc/sys/kernel/hostname", "/proc/sysrq-trigger", "/proc/sys/vm/drop_caches"} {
			if res := sh("echo 1 > " + f); res.ExitCode == 0 {
				t.Errorf("writing %s succeeded", f)
			}
		}
		if res := sh("cat /proc/kcore | head -c 1 | wc -c"); strings.TrimSpace(res.Stdout) != "0" {
			t.Errorf("/proc/kcore readable: %q", res.Stdout)
		}
	})
	t.Run("NoHostPaths", func(t *testing.T) {
		// Overlay options and bind roots used to show the state dir and
		// the box id; the kernel's command line, configuration and crash
		// notes, the host's swap files and loop devices' backing files
		// were readable.
		mi := sh("cat /proc/self/mountinfo").Stdout
		for _, s := range []string{dir, h.ID} {
			if strings.Contains(mi, s) {
				t.Errorf("mountinfo shows %q:\n%s", s, mi)
			}
		}
		for _, p := range []string{"/proc/cmdline", "/proc/config.gz", "/sys/kernel/vmcoreinfo", "/proc/swaps", "/proc/partitions"} {
			if res := sh("cat " + p + " 2>/dev/null | wc -c"); strings.TrimSpace(res.Stdout) != "0" {
				t.Errorf("%s: %s bytes readable, want none", p, strings.TrimSpace(res.Stdout))
			}
		}
		// /sys/block/loopN still names the devices, but its links lead
		// into the masked /sys/devices/virtual/block.
		if res := sh("ls /sys/devices/virtual/block | wc -l; cat /sys/block/loop*/size /sys/block/loop*/loop/backing_file 2>/dev/null | wc -c"); res.Stdout != "0\n0\n" {
			t.Errorf("loop devices in the box's sysfs: got %q, want none listed and nothing readable", res.Stdout)
		}
		if res := sh("test -x /.sbx/sbx-agent && test -c /dev/fuse && echo ok"); res.Stdout != "ok\n" {
			t.Errorf("agent binary and /dev/fuse in the box: %q %q", res.Stdout, res.Stderr)
		}
	})
	t.Run("UserNamespace", func(t *testing.T) {
		if res := sh("id -u; mkdir /newdir && echo 1.2.3.4 x >> /etc/hosts && echo ok"); res.Stdout != "0\nok\n" {
			t.Errorf("id -u; mkdir; write /etc/hosts: got %q %q, want root that can write its rootfs", res.Stdout, res.Stderr)
		}
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", initPid(t, h)))
		if err != nil {
			t.Fatal(err)
		}
		if uid, _ := strconv.ParseUint(strings.Fields(statusField(t, string(status), "Uid"))[0], 10, 32); uid < 1<<28 {
			t.Errorf("box init's host uid = %d, want the box's own unprivileged uid (from 2^28)", uid)
		}
	})
	// Docker's capabilities, seccomp, no_new_privs and confined host
	// processes are checked for every driver by the conformance suite
	// (testsuite: Isolation); these are the oci driver's own details.
	t.Run("CapabilitiesSeccomp", func(t *testing.T) {
		// The agent itself is filtered too: it installs the filter first
		// thing (--seccomp), the runtime none.
		initStatus, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", initPid(t, h)))
		if err != nil {
			t.Fatal(err)
		}
		if got := statusField(t, string(initStatus), "Seccomp"); got != "2" {
			t.Errorf("agent's Seccomp = %s, want 2 (filter)", got)
		}
		if got := statusField(t, string(initStatus), "Seccomp_filters"); got == "" || got == "0" {
			t.Errorf("agent's Seccomp_filters = %q, want at least 1", got)
		}
		if goruntime.GOARCH == "amd64" { // where internal/seccomp has a syscall table
			cfg, err := os.ReadFile(filepath.Join(dir, "boxes", h.ID, "bundle", "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(cfg), `"seccomp"`) || !strings.Contains(string(cfg), `"--seccomp"`) {
				t.Errorf("config.json: want no runtime seccomp profile and the agent's --seccomp")
			}
		}
		if res := sh("unshare -U true 2>&1; echo $?"); strings.HasSuffix(res.Stdout, "\n0\n") || res.Stdout == "0\n" {
			t.Errorf("unshare -U succeeded in the box: %q", res.Stdout)
		}
	})
	t.Run("Python", func(t *testing.T) {
		if res := testsuite.MustExec(t, d, h, "/usr/bin/python3", "-c", "import ssl, json; print(6*7)"); res.Stdout != "42\n" {
			t.Errorf("python3: got %q %q", res.Stdout, res.Stderr)
		}
	})

}

func TestLimits(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := stateRoot(t)
	d := newDriver(t, dir)
	ctx := context.Background()

	// The suite's MemoryBound holds every driver to the bound; this checks
	// the oci driver's limit events too.
	t.Run("MemoryHogKilled", func(t *testing.T) {
		spec := testsuite.NewSpec("hog")
		spec.Resources.MemoryBytes = 64 << 20
		h := testsuite.Create(t, d, spec)
		res := testsuite.MustExec(t, d, h, "/usr/bin/python3", "-c", "a = bytearray(512<<20); print('survived')")
		if res.Stdout != "" || res.ExitCode == 0 {
			t.Errorf("512 MiB hog in a 64 MiB box: got exit %d stdout %q, want it killed", res.ExitCode, res.Stdout)
		}
		if st, err := d.Stats(ctx, h); err != nil || st.OOMKills < 1 {
			t.Errorf("Stats after the hog: %+v, %v; want OOMKills >= 1", st, err)
		}
		if ev, err := d.LimitEvents(ctx, h); err != nil || ev.OOMKills < 1 || ev.PidsLimitHits != 0 {
			t.Errorf("LimitEvents after the hog: %+v, %v; want OOMKills >= 1 and no refused fork", ev, err)
		}
		if err := testsuite.Hello(ctx, d, h); err != nil {
			t.Errorf("agent after the hog: %v", err)
		}
	})
	t.Run("ForkBombContained", func(t *testing.T) {
		spec := testsuite.NewSpec("bomb")
		spec.Resources.Pids = 64
		h := testsuite.Create(t, d, spec)
		if ev, err := d.LimitEvents(ctx, h); err != nil || ev != (runtime.LimitEvents{}) {
			t.Errorf("LimitEvents of a new box: %+v, %v; want zeros", ev, err)
		}
		start := time.Now()
		testsuite.MustExec(t, d, h, "/bin/sh", "-c", "timeout -s KILL 3 /bin/sh -c 'f() { f | f & }; f; sleep 10' 2>/dev/null; true")
		t.Logf("bomb ran %v", time.Since(start))
		// On cgroup v1 the bomb fills the box's user cgroup (usercgroup.go),
		// which stops it 32 pids short of the box's limit: the box itself
		// never refuses a fork, so the agent can always start a thread.
		// On v2 the box's own limit stops it.
		count := func(f string) int {
			b, _ := os.ReadFile(f)
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(string(b), "max ")))
			return n
		}
		v1 := filepath.Join("/sys/fs/cgroup/pids", cgroupParent(dir), h.ID)
		if _, err := os.Stat(v1); err == nil {
			if n := count(filepath.Join(v1, "user", "pids.events")); n == 0 {
				t.Errorf("user cgroup's pids.events: 0 fork failures, want the bomb stopped there")
			}
			if n := count(filepath.Join(v1, "pids.events")); n != 0 {
				t.Errorf("box's pids.events: %d fork failures, want 0 (the agent's reserve untouched)", n)
			}
			if got := count(filepath.Join(v1, "user", "pids.max")); got != 32 {
				t.Errorf("user cgroup's pids.max = %d, want 32 (64 less the agent's 32)", got)
			}
		} else if n := count(filepath.Join("/sys/fs/cgroup", cgroupParent(dir), h.ID, "pids.events")); n == 0 {
			t.Errorf("box's pids.events: 0 fork failures, want the bomb stopped")
		}
		if ev, err := d.LimitEvents(ctx, h); err != nil || ev.PidsLimitHits < 1 {
			t.Errorf("LimitEvents after the bomb: %+v, %v; want PidsLimitHits >= 1", ev, err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			res, err := testsuite.Exec(ctx, d, h, "echo", "alive")
			if err == nil && res.Stdout == "alive\n" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("box does not answer after the fork bomb: %+v %v", res, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	t.Run("ImpossibleMemory", func(t *testing.T) {
		spec := testsuite.NewSpec("tiny")
		spec.Resources.MemoryBytes = 1
		if h, err := d.Create(ctx, spec); err == nil {
			d.Destroy(ctx, h)
			t.Fatalf("Create with a 1-byte memory limit succeeded")
		} else {
			t.Logf("Create with 1 byte of memory: %v", err)
		}
	})
	checkNoLeftovers(t, d, dir)
}

func TestDestroyLeavesNothing(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := stateRoot(t)
	d := newDriver(t, dir)
	ctx := context.Background()
	var pids []int
	for i := 0; i < 3; i++ {
		spec := testsuite.NewSpec("leak")
		h, err := d.Create(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, initPid(t, h))
		if i == 1 {
			testsuite.MustExec(t, d, h, "/bin/sh", "-c", "sleep 100 & sleep 100 & echo started")
		}
		if i == 2 {
			if err := d.Pause(ctx, h); err != nil {
				t.Fatal(err)
			}
		}
		if err := d.Destroy(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	checkNoLeftovers(t, d, dir)
	// The runtime's own leftovers (crun's detached child) are Destroy's to
	// reap; the box inits are checked below. Other zombies of this test
	// process (it is a subreaper, and earlier tests' helpers end up here)
	// are not the driver's.
	if z := zombieChildren("(crun)", "(runc)"); len(z) > 0 {
		t.Errorf("zombie runtime children of the driver's process: %v", z)
	}
	for _, pid := range pids {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			t.Errorf("box init pid %d still exists", pid)
		}
	}
}

// zombieChildren lists zombies whose parent is this (subreaper) process.
// zombieChildren lists this process's zombie children whose "(comm)" is
// one of comms.
func zombieChildren(comms ...string) []string {
	var out []string
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		fields := strings.Fields(s[i+1:])
		if len(fields) > 1 && fields[0] == "Z" && fields[1] == strconv.Itoa(os.Getpid()) && slices.Contains(comms, s[strings.IndexByte(s, '('):i+1]) {
			out = append(out, s[:i+1])
		}
	}
	return out
}
