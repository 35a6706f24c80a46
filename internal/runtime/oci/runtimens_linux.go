//go:build linux

package oci

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/osthread"
)

// crunUnified is where crun looks for the cgroup2 mount of a hybrid host
// (its CGROUP_ROOT "/unified", compiled in). crun refuses to start any
// container ("cgroups in hybrid mode not supported") when that hierarchy
// has a controller, even with --cgroup-manager=disabled: the check comes
// before the manager is consulted. Where it sees no cgroup2 mount there it
// takes the host for a legacy (v1-only) one and manages the v1 hierarchies
// exactly as runc does: it makes the box's cgroup in each, sets every
// limit of config.json there and puts the container's init in them before
// the init unshares its cgroup namespace.
const crunUnified = "/sys/fs/cgroup/unified"

// boxV1Controllers are the controllers whose limits and state the driver
// relies on (memory, pids and CPU limits, CPU accounting, the freezer for
// pause and teardown, the device allowlist). When all of them are v1
// hierarchies, what the cgroup2 mount of a hybrid host holds is nothing a
// box is limited by (sbx sets no hugetlb, rdma or misc limits), so crun may
// run without seeing it.
var boxV1Controllers = []string{"memory", "pids", "cpu", "cpuacct", "freezer", "devices"}

// crunHideUnified says whether crun, on host layout l, must run without
// seeing the cgroup2 mount (see crunUnified): it returns the mount to hide
// and a note for the driver's health detail saying so, or "" when crun
// works as it is, or an error saying why crun cannot be used at all.
func crunHideUnified(l cgroupLayout) (hide, note string, err error) {
	if !l.hybrid() {
		return "", "", nil
	}
	if filepath.Clean(l.unified) != crunUnified {
		return "", "", fmt.Errorf("hybrid cgroup layout with cgroup2 at %s, not %s", l.unified, crunUnified)
	}
	b, err := os.ReadFile(filepath.Join(l.unified, "cgroup.controllers"))
	if err != nil {
		return "", "", fmt.Errorf("read cgroup2 controllers: %w", err)
	}
	v2 := strings.Fields(string(b))
	if len(v2) == 0 {
		return "", "", nil // crun accepts a hybrid host whose cgroup2 has no controller
	}
	for _, c := range boxV1Controllers {
		if _, ok := l.v1[c]; !ok {
			return "", "", fmt.Errorf("hybrid cgroup layout without a v1 %s hierarchy (cgroup2 holds %s)", c, strings.Join(v2, " "))
		}
	}
	return crunUnified, fmt.Sprintf("hybrid cgroups: crun runs without %s (cgroup2 holds only %s, which boxes are not limited by) and manages the v1 hierarchies",
		crunUnified, strings.Join(v2, " ")), nil
}

// unifiedBoxCgroup makes box id's cgroup in the cgroup2 hierarchy of a
// hybrid host and opens it, for a runtime that does not see that hierarchy
// to be started in (clone3's CLONE_INTO_CGROUP). Teardown removes it with
// the box's other cgroups (cgroupLayout.remove).
func (l cgroupLayout) unifiedBoxCgroup(id string) (*os.File, error) {
	dir := filepath.Join(l.unified, l.parent, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create box cgroup in %s: %w", l.unified, err)
	}
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open box cgroup in %s: %w", l.unified, err)
	}
	return f, nil
}

// killUnifiedBoxCgroup kills every process in box id's cgroup2 cgroup and
// waits until the cgroup is empty. A runtime started there
// (unifiedBoxCgroup) is cancelled with it: `crun run --detach` makes the
// container in a child of its own (in a session of its own), which killing
// the crun that the driver started leaves running, to make the box's
// cgroups and container after the create's rollback has removed them.
func (l cgroupLayout) killUnifiedBoxCgroup(id string) error {
	dir := filepath.Join(l.unified, l.parent, id)
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil {
		// Before cgroup.kill (Linux 5.14): one by one, until none is left.
		for _, pid := range readPids(filepath.Join(dir, "cgroup.procs")) {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
	delay := 100 * time.Microsecond
	for deadline := time.Now().Add(5 * time.Second); ; {
		pids := readPids(filepath.Join(dir, "cgroup.procs"))
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kill box %s's runtime: %d processes left in %s", id, len(pids), dir)
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(delay)
		delay = min(2*delay, 10*time.Millisecond)
	}
}

// runCmd runs cmd. With netns or hide set it runs it from an OS thread of
// its own (osthread: never the main thread, whose namespaces /proc/self
// shows) that first joins the network namespace at netns and, for hide,
// enters a mount namespace of its own: a copy of the daemon's, made a
// slave of it (so nothing done in it reaches the host's), in which the
// mount at hide is detached. cmd, and everything it starts, inherits both;
// the thread and its namespaces end with the call.
func runCmd(cmd *exec.Cmd, netns, hide string) error {
	if netns == "" && hide == "" {
		return runTracked(cmd)
	}
	return osthread.Run(func() error { return runInNamespaces(cmd, netns, hide) })
}

// runInNamespaces does runCmd's work on the calling thread, which must be
// one of osthread's.
func runInNamespaces(cmd *exec.Cmd, netns, hide string) error {
	if hide != "" {
		if err := hideMount(hide); err != nil {
			return err
		}
	}
	if netns != "" {
		fd, err := unix.Open(netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open network namespace: %w", err)
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("join network namespace %s: %w", netns, err)
		}
	}
	return runTracked(cmd)
}

// hideMount moves the calling (locked) thread into a new mount namespace
// in which the mount at path is gone. unshare(CLONE_NEWNS) also unshares
// the thread's filesystem context (CLONE_FS), which Go's threads share.
func hideMount(path string) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare mount namespace for the runtime: %w", err)
	}
	// Slave first: on a host whose mounts are shared the unmount would
	// otherwise propagate back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make the runtime's mount namespace a slave: %w", err)
	}
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("hide %s from the runtime: %w", path, err)
	}
	return nil
}

// RuntimeRunner returns a function running commands of the OCI runtime
// binary at path as the driver would on this host (crun on a hybrid host
// without the cgroup2 mount, see crunHideUnified), for benchmarks'
// baselines; an error says why the driver would not use the runtime.
func RuntimeRunner(path string) (func(*exec.Cmd) error, error) {
	if filepath.Base(path) != "crun" {
		return func(cmd *exec.Cmd) error { return cmd.Run() }, nil
	}
	l, err := detectCgroups(defaultCgroupParent)
	if err != nil {
		return nil, err
	}
	hide, _, err := crunHideUnified(l)
	if err != nil {
		return nil, err
	}
	return func(cmd *exec.Cmd) error { return runCmd(cmd, "", hide) }, nil
}
