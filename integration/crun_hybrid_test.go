package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// boxCgroupDir finds box id's directory in the v1 hierarchy of ctrl on the
// host ("" if the host has none).
func boxCgroupDir(t *testing.T, ctrl, id string) string {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", ctrl, "*", id))
	if len(dirs) != 1 {
		t.Fatalf("box %s: %d cgroup dirs in the %s hierarchy (%v), want 1", id, len(dirs), ctrl, dirs)
	}
	return dirs[0]
}

// TestBoxDeviceCgroupIsTheDrivers: on each OCI runtime, the device cgroup
// of a box on the host allows exactly the devices the driver's config
// allows, none of the defaults the runtimes add of their own (runc 1.1:
// /dev/net/tun; crun: /dev/console; both: mknod of every device), so what
// a box can open does not depend on which runtime the daemon picked.
func TestBoxDeviceCgroupIsTheDrivers(t *testing.T) {
	if _, err := os.Stat("/sys/fs/cgroup/devices/devices.list"); err != nil {
		t.Skip("no v1 devices hierarchy")
	}
	want := []string{"c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm",
		"c 5:0 rwm", "c 5:2 rwm", "c 136:* rwm", "c 10:229 rwm"}
	slices.Sort(want)
	for _, rt := range []string{"crun", "runc"} {
		t.Run(rt, func(t *testing.T) {
			requireRuntime(t, rt)
			d := startDaemon(t, "--oci-runtime", rt)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			sb := newBox(t, ctx, d, sbx.CreateOptions{})
			b, err := os.ReadFile(filepath.Join(boxCgroupDir(t, "devices", sb.ID), "devices.list"))
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Split(strings.TrimSpace(string(b)), "\n")
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("box device cgroup on %s allows\n  %s\nwant\n  %s", rt, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
			}
			execWorks(t, sb, "after narrowing its devices")
		})
	}
}

func requireRuntime(t *testing.T, rt string) {
	t.Helper()
	for _, dir := range []string{"/usr/bin", "/usr/local/bin", "/usr/sbin", "/bin"} {
		if _, err := os.Stat(filepath.Join(dir, rt)); err == nil {
			return
		}
	}
	t.Skipf("%s not installed", rt)
}

// TestCrunBoxesLeaveNothingBehind drives boxes on crun (which, on a hybrid
// host, runs from a mount namespace of its own and leaves a detached child
// per create) and checks from the host: a box's mount table names no other
// box and none of the daemon's state; every process of a box, a setsid
// double-forked one too, is in the box's cgroup in every hierarchy, v1
// and v2; after creates and destroys, no process anywhere has a mount of a
// destroyed box, every daemon thread is in the daemon's own mount and
// network namespaces, and the daemon has no zombie child.
func TestCrunBoxesLeaveNothingBehind(t *testing.T) {
	requireRuntime(t, "crun")
	d := startDaemon(t, "--oci-runtime", "crun")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := d.client()
	neighbour := newBox(t, ctx, d, sbx.CreateOptions{})

	var gone []string
	for i := range 4 {
		sb, err := c.Create(ctx, sbx.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		d.remember(sb.ID)
		if i == 0 {
			res, err := sb.RunShell(ctx, "cat /proc/self/mountinfo; setsid sh -c 'sleep 300 </dev/null >/dev/null 2>&1 &' </dev/null >/dev/null 2>&1")
			if err != nil || res.Code != 0 {
				t.Fatalf("run in box: %v %+v", err, res)
			}
			for _, bad := range []string{d.dataDir, neighbour.ID} {
				if strings.Contains(string(res.Stdout), bad) {
					t.Errorf("box %s's mount table names %s:\n%s", sb.ID, bad, res.Stdout)
				}
			}
			checkBoxCgroups(t, d, sb.ID)
		}
		if err := sb.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
		gone = append(gone, sb.ID)
	}
	d.assertNoLeaks(neighbour.ID)

	pid := d.cmd.Process.Pid
	mounts, _ := filepath.Glob("/proc/[0-9]*/mountinfo")
	for _, m := range mounts {
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		for _, id := range gone {
			if strings.Contains(string(b), id) {
				t.Errorf("%s still has a mount of destroyed box %s", m, id)
			}
		}
	}
	for _, ns := range []string{"mnt", "net"} {
		own, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		if err != nil {
			t.Fatal(err)
		}
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/ns/%s", pid, ns))
		for _, task := range tasks {
			if got, err := os.Readlink(task); err == nil && got != own {
				t.Errorf("daemon thread %s is in %s, want the daemon's %s", task, got, own)
			}
		}
	}
	execWorks(t, neighbour, "neighbour after the creates and destroys")
}

// checkBoxCgroups checks that every process of box id on the host (found
// by its sandbox id in the environment) is in the box's cgroup, or one
// below it, in every hierarchy.
func checkBoxCgroups(t *testing.T, d *daemon, id string) {
	t.Helper()
	n := 0
	procs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), "SBX_SANDBOX_ID="+id+"\x00") {
			continue
		}
		cg, err := os.ReadFile(filepath.Join(filepath.Dir(p), "cgroup"))
		if err != nil {
			continue
		}
		n++
		for _, line := range strings.Split(strings.TrimSpace(string(cg)), "\n") {
			parts := strings.SplitN(line, ":", 3)
			if len(parts) != 3 || !strings.Contains(parts[2]+"/", "/"+id+"/") {
				t.Errorf("%s of box %s: cgroup %q is not the box's", filepath.Dir(p), id, line)
			}
		}
	}
	if n < 2 {
		t.Errorf("found %d processes of box %s on the host, want the agent and the double-forked sleep", n, id)
	}
}

// TestCrunEscapedBombsStayInTheirBox: on crun, a memory hog and a fork
// bomb that box root detaches from the agent (setsid, double fork) are
// still held by the box's cgroups: the host sees an OOM kill counted in
// the box's memory cgroup (or its user cgroup below) and the user cgroup's
// pids.current reach its pids.max, while a neighbour keeps answering
// execs.
func TestCrunEscapedBombsStayInTheirBox(t *testing.T) {
	requireRuntime(t, "crun")
	if _, err := os.Stat("/sys/fs/cgroup/pids/cgroup.procs"); err != nil {
		t.Skip("no v1 pids hierarchy")
	}
	d := startDaemon(t, "--oci-runtime", "crun")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	neighbour := newBox(t, ctx, d, sbx.CreateOptions{})
	bomb := newBox(t, ctx, d, sbx.CreateOptions{Pids: 64, MemoryBytes: 128 << 20})
	start := func(cmd string) {
		t.Helper()
		res, err := bomb.RunShell(ctx, "setsid sh -c '"+cmd+" </dev/null >/dev/null 2>&1 &' </dev/null >/dev/null 2>&1")
		if err != nil || res.Code != 0 {
			t.Fatalf("start %s: %v %+v", cmd, err, res)
		}
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); !ok(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("bomb box %s: %s not seen on the host within a minute", bomb.ID, what)
			}
		}
	}
	mem := boxCgroupDir(t, "memory", bomb.ID)
	start("tail /dev/zero")
	waitFor("an OOM kill", func() bool {
		for _, dir := range []string{mem, filepath.Join(mem, "user")} {
			b, _ := os.ReadFile(filepath.Join(dir, "memory.oom_control"))
			if strings.Contains(string(b), "oom_kill ") && !strings.Contains(string(b), "oom_kill 0") {
				return true
			}
		}
		return false
	})
	pids := boxCgroupDir(t, "pids", bomb.ID)
	user := filepath.Join(pids, "user")
	if _, err := os.Stat(user); err != nil {
		user = pids
	}
	start(`bash -c "while :; do sleep 1000 & done"`)
	waitFor("pids.current at pids.max", func() bool {
		cur, _ := os.ReadFile(filepath.Join(user, "pids.current"))
		limit, _ := os.ReadFile(filepath.Join(user, "pids.max"))
		return len(cur) > 0 && string(cur) == string(limit)
	})
	execWorks(t, neighbour, "neighbour of a pids-full, OOM-killing crun box")
}
