//go:build linux

package gvisor_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sbxdev/sbx/internal/idmap"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/testsuite"
	"github.com/sbxdev/sbx/internal/testutil"
)

// TestIsolation: a box runs on gVisor's kernel and its files are its
// root's. What every driver must hold (no host files, processes or
// services, capabilities, seccomp, confined host processes, the disk
// bound, an immutable agent) the conformance suite checks.
func TestIsolation(t *testing.T) {
	testutil.RequiresRoot(t)
	dir, cg := stateRoot(t)
	d := newDriver(t, dir, cg)
	h := testsuite.Create(t, d, testsuite.NewSpec("iso"))
	for _, tc := range []struct {
		name string
		argv []string
		ok   func(r testsuite.ExecResult) bool
		want string
	}{
		// dmesg would say so too, but the seccomp profile refuses syslog.
		{"gvisor kernel", []string{"cat", "/proc/version"}, func(r testsuite.ExecResult) bool { return strings.Contains(r.Stdout, "gvisor") }, "/proc/version names gvisor"},
		{"root owns root", []string{"stat", "-c", "%u:%g", "/etc/hostname"}, func(r testsuite.ExecResult) bool { return r.Stdout == "0:0\n" }, "0:0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testsuite.MustExec(t, d, h, tc.argv...)
			if !tc.ok(r) {
				t.Errorf("%q: got %+v, want %s", tc.argv, r, tc.want)
			}
		})
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
// socket; the daemon's dial must not reach that host socket, and still
// reaches the agent (through the links pinSockets made).
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
	if err := testsuite.Hello(ctx, d, h); err != nil {
		t.Errorf("Hello after the box replaced its sockets: %v, want the agent reached", err)
	}
	if c, err := d.DialExec(ctx, h); err != nil {
		t.Errorf("DialExec after the box replaced its sockets: %v, want the agent reached", err)
	} else {
		c.Close()
	}
	select {
	case <-reached:
		t.Errorf("the host socket the box linked to was connected to")
	case <-time.After(200 * time.Millisecond):
	}
}

// TestRecoverPinsOlderBoxSockets: a box made before the driver pinned the
// agent's sockets (no links in its box dir) gets them pinned when a new
// driver recovers it, so box root unlinking the files in /.sbx/run no
// longer cuts the daemon off from its agent.
func TestRecoverPinsOlderBoxSockets(t *testing.T) {
	testutil.RequiresRoot(t)
	dir, cg := stateRoot(t)
	d := newDriver(t, dir, cg)
	h := testsuite.Create(t, d, testsuite.NewSpec("oldpin"))
	box := filepath.Join(dir, "boxes", h.ID)
	for _, l := range []string{"agent.sock", "exec.sock"} { // as an older driver left it
		if err := os.Remove(filepath.Join(box, l)); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	d2 := newDriver(t, dir, cg)
	if _, err := d2.Recover(ctx, h); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	testsuite.MustExec(t, d2, h, "sh", "-c", "rm -f /.sbx/run/agent.sock /.sbx/run/exec.sock")
	if err := testsuite.Hello(ctx, d2, h); err != nil {
		t.Errorf("Hello after box root unlinked the sockets of a recovered box: %v", err)
	}
}
