//go:build linux

package gvisor_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sbxdev/sbx/internal/idmap"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/testsuite"
	"github.com/sbxdev/sbx/internal/testutil"
)

// TestIsolation: a box runs on gVisor's kernel, sees none of the host's
// files or processes, and its disk is bounded by its limit on the host.
func TestIsolation(t *testing.T) {
	testutil.RequiresRoot(t)
	dir, cg := stateRoot(t)
	d := newDriver(t, dir, cg)
	secret := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(secret, []byte("s3cret"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := testsuite.NewSpec("iso")
	spec.Resources.DiskBytes = 16 << 20
	h := testsuite.Create(t, d, spec)
	for _, tc := range []struct {
		name string
		argv []string
		ok   func(r testsuite.ExecResult) bool
		want string
	}{
		{"gvisor kernel", []string{"dmesg"}, func(r testsuite.ExecResult) bool { return strings.Contains(r.Stdout, "gVisor") }, "dmesg mentions gVisor"},
		{"no host file", []string{"cat", secret}, func(r testsuite.ExecResult) bool { return r.ExitCode != 0 && !strings.Contains(r.Stdout, "s3cret") }, "cat fails"},
		{"no host process", []string{"sh", "-c", "test -e /proc/" + strconv.Itoa(os.Getpid()) + "/cmdline && cat /proc/" + strconv.Itoa(os.Getpid()) + "/cmdline"},
			func(r testsuite.ExecResult) bool { return !strings.Contains(r.Stdout, ".test") }, "the test binary's pid not visible"},
		{"agent is init", []string{"cat", "/proc/1/cmdline"}, func(r testsuite.ExecResult) bool { return strings.HasPrefix(r.Stdout, "/.sbx/sbx-agent") }, "pid 1 is the agent"},
		{"agent immutable", []string{"sh", "-c", "echo x > /.sbx/sbx-agent"}, func(r testsuite.ExecResult) bool { return r.ExitCode != 0 }, "writing the agent fails"},
		{"root owns root", []string{"stat", "-c", "%u:%g", "/etc/hostname"}, func(r testsuite.ExecResult) bool { return r.Stdout == "0:0\n" }, "0:0"},
		{"disk bound in /tmp", []string{"dd", "if=/dev/zero", "of=/tmp/fill", "bs=1M", "count=64"},
			func(r testsuite.ExecResult) bool {
				return r.ExitCode != 0 && strings.Contains(r.Stderr, "No space left")
			}, "ENOSPC"},
		{"disk bound in /root", []string{"sh", "-c", "rm -f /tmp/fill; dd if=/dev/zero of=/root/fill bs=1M count=64"},
			func(r testsuite.ExecResult) bool {
				return r.ExitCode != 0 && strings.Contains(r.Stderr, "No space left")
			}, "ENOSPC"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testsuite.MustExec(t, d, h, tc.argv...)
			if !tc.ok(r) {
				t.Errorf("%q: got %+v, want %s", tc.argv, r, tc.want)
			}
		})
	}
	st, err := d.Stats(context.Background(), h)
	if err != nil {
		t.Fatal(err)
	}
	if st.DiskUsedBytes > spec.Resources.DiskBytes {
		t.Errorf("disk used on the host = %d, want ≤ the %d limit", st.DiskUsedBytes, spec.Resources.DiskBytes)
	}
}

// TestVolumeMount: a host directory in the canonical range is mounted
// read-write; what the box writes lands there, owned by the canonical root.
func TestVolumeMount(t *testing.T) {
	testutil.RequiresRoot(t)
	dir, cg := stateRoot(t)
	d := newDriver(t, dir, cg)
	vol := filepath.Join(dir, "vol")
	if err := os.MkdirAll(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	c := int(idmap.Canonical.Base)
	if err := os.Chown(vol, c, c); err != nil {
		t.Fatal(err)
	}
	spec := testsuite.NewSpec("vol")
	spec.Mounts = []runtime.Mount{{Volume: &runtime.VolumeMount{Name: "vol", Dir: vol}, Destination: "/data"}}
	h := testsuite.Create(t, d, spec)
	if r := testsuite.MustExec(t, d, h, "sh", "-c", "echo hi > /data/f"); r.ExitCode != 0 {
		t.Fatalf("write to the volume: %+v", r)
	}
	b, err := os.ReadFile(filepath.Join(vol, "f"))
	if err != nil || string(b) != "hi\n" {
		t.Fatalf("host sees %q, %v; want \"hi\\n\"", b, err)
	}
	fi, err := os.Stat(filepath.Join(vol, "f"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != uint32(c) {
		t.Errorf("file the box's root wrote is host uid %d, want %d (the canonical root)", st.Uid, c)
	}
}

// TestCreateTimeoutLeavesNothing: a create cut off by its context at any
// point leaves no box dir, mount, runsc state or cgroup behind.
func TestCreateTimeoutLeavesNothing(t *testing.T) {
	testutil.RequiresRoot(t)
	dir, cg := stateRoot(t)
	d := newDriver(t, dir, cg)
	for _, after := range []time.Duration{time.Millisecond, 20 * time.Millisecond, 60 * time.Millisecond, 120 * time.Millisecond} {
		ctx, cancel := context.WithTimeout(context.Background(), after)
		h, err := d.Create(ctx, testsuite.NewSpec("cut"))
		cancel()
		if err == nil {
			// Fast enough: the box exists and must go the ordinary way.
			if err := d.Destroy(context.Background(), h); err != nil {
				t.Fatalf("Destroy: %v", err)
			}
		} else if !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "killed") && !strings.Contains(err.Error(), "deadline") {
			t.Logf("create cut after %v: %v", after, err)
		}
	}
	checkNoLeftovers(t, dir, cg)
}

// TestDestroyWithoutRunscState: a box whose runsc state file is gone (runsc
// was killed before it wrote it: a daemon crash during `runsc run`) is
// still destroyed completely by Cleanup: its sandbox and gofer processes
// killed through its cgroup, runsc's lock and socket files and the cgroup
// dirs removed.
func TestDestroyWithoutRunscState(t *testing.T) {
	testutil.RequiresRoot(t)
	dir, cg := stateRoot(t)
	d := newDriver(t, dir, cg)
	spec := testsuite.NewSpec("orphan")
	ctx := context.Background()
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	states, _ := filepath.Glob(filepath.Join(dir, "runsc", spec.ID+"_sandbox:*.state"))
	if len(states) != 1 {
		t.Fatalf("runsc state files of %s: %v, want one", spec.ID, states)
	}
	if err := os.Remove(states[0]); err != nil {
		t.Fatal(err)
	}
	if err := newDriver(t, dir, cg).Cleanup(ctx, nil); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	checkNoLeftovers(t, dir, cg)
}

// TestAgentSocketLinkNotFollowed: box root replaces the agent's socket
// file (which runsc's gofer makes on the host) with a symlink to a host
// socket; the daemon's dial must not reach that host socket.
func TestAgentSocketLinkNotFollowed(t *testing.T) {
	testutil.RequiresRoot(t)
	dir, cg := stateRoot(t)
	d := newDriver(t, dir, cg)
	hostSock := filepath.Join(dir, "host.sock")
	ln, err := net.Listen("unix", hostSock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	reached := make(chan struct{}, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			reached <- struct{}{}
			c.Close()
		}
	}()
	h := testsuite.Create(t, d, testsuite.NewSpec("link"))
	for _, name := range []string{"exec.sock", "agent.sock"} {
		r := testsuite.MustExec(t, d, h, "sh", "-c", "rm -f /.sbx/run/"+name+" && ln -s "+hostSock+" /.sbx/run/"+name)
		if r.ExitCode != 0 {
			t.Fatalf("replacing %s with a link: %+v", name, r)
		}
	}
	if fi, err := os.Lstat(filepath.Join(dir, "boxes", h.ID, "run", "agent.sock")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the box's link is not on the host (%v, %v): the test proves nothing", fi, err)
	}
	ctx := context.Background()
	if c, err := d.Dial(ctx, h); err == nil {
		c.Close()
		t.Errorf("Dial through the box's link succeeded, want it refused")
	}
	if c, err := d.DialExec(ctx, h); err == nil {
		c.Close()
		t.Errorf("DialExec through the box's link succeeded, want it refused")
	}
	select {
	case <-reached:
		t.Errorf("the host socket the box linked to was connected to")
	case <-time.After(200 * time.Millisecond):
	}
}
