package idmap

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// HelperArg, as the first argument of the binary BoxNamespace runs (the
// agent), makes it run Helper instead of its usual job.
const HelperArg = "sbx-box-userns-helper"

var rlimitResource = map[string]int{"sigpending": unix.RLIMIT_SIGPENDING, "msgqueue": unix.RLIMIT_MSGQUEUE}

// HostLimits reads the limits above every box: this process's user
// namespace's /proc/sys/user/max_* (names this kernel lacks are left out)
// and its hard RLIMIT_SIGPENDING and RLIMIT_MSGQUEUE, which a helper it
// starts cannot go past.
func HostLimits() (Limits, error) {
	l := Limits{}
	for _, name := range sysctlNames {
		b, err := os.ReadFile("/proc/sys/user/max_" + name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read host limit: %w", err)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("read host limit max_%s: %w", name, err)
		}
		l[name] = n
	}
	for name, res := range rlimitResource {
		var rl unix.Rlimit
		if err := unix.Getrlimit(res, &rl); err != nil {
			return nil, fmt.Errorf("read host limit %s: %w", name, err)
		}
		l[name] = int64(min(rl.Max, 1<<31-1))
	}
	return l, nil
}

// boxNamespace makes box r's user namespace with limits lim (see Limits)
// and bind-mounts it at path. It runs on a locked thread whose effective
// ids are r.Base, so the box's parent namespace is r.Base's: the helper
// (exe HelperArg ...) is cloned into that parent, mapping r to itself,
// as r.Base with the capabilities it needs there in its ambient set. It
// sets the parent's limits, makes the box's namespace (0.. mapped to r)
// from a child it stops at its exec, and prints that child's pid; the
// namespace is bound from another thread, with the daemon's credentials,
// and the helper is told to end by closing its stdin.
func boxNamespace(r Range, exe, path string, lim Limits) error {
	if err := setThreadIDs(int(r.Base), false); err != nil {
		return err
	}
	self := []syscall.SysProcIDMap{{ContainerID: int(r.Base), HostID: int(r.Base), Size: int(r.Size)}}
	cmd := exec.Command(exe, HelperArg, strconv.FormatUint(uint64(r.Base), 10), strconv.FormatUint(uint64(r.Size), 10), lim.String())
	cmd.Env = []string{}
	cmd.Dir = "/"
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER,
		UidMappings: self, GidMappings: self, GidMappingsEnableSetgroups: true,
		// Its own ids (not just effective ones), so that it stays
		// dumpable and may write its child's maps; its capabilities are
		// in the parent namespace only.
		Credential:  &syscall.Credential{Uid: r.Base, Gid: r.Base},
		AmbientCaps: []uintptr{unix.CAP_SETUID, unix.CAP_SETGID, unix.CAP_SYS_RESOURCE},
		Pdeathsig:   unix.SIGKILL,
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return fmt.Errorf("box user namespace helper: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("box user namespace helper: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start box user namespace helper: %w", err)
	}
	// Whatever happens, the helper ends (it kills its child then) and is reaped.
	timer := time.AfterFunc(30*time.Second, func() { _ = cmd.Process.Kill() })
	defer func() {
		timer.Stop()
		_ = stdin.Close()
		_ = cmd.Wait()
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	pid, perr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || perr != nil || pid <= 0 {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return fmt.Errorf("box user namespace helper: %q, %v: %s", line, err, strings.TrimSpace(stderr.String()))
	}
	done := make(chan error, 1)
	go func() { // a thread with the daemon's credentials
		src := "/proc/" + strconv.Itoa(pid) + "/ns/user"
		if err := unix.Mount(src, path, "", unix.MS_BIND, ""); err != nil {
			done <- fmt.Errorf("bind user namespace at %s: %w", path, err)
			return
		}
		done <- nil
	}()
	return <-done
}

// Helper is the helper's side of BoxNamespace, in the box's parent
// namespace: args are the range's base and size and the Limits. It writes
// the parent's /proc/sys/user/max_* (one more user namespace than the
// limit: the box's own is one), lowers its own rlimits, which become the
// box namespace's ceilings, makes the box's namespace in a child stopped
// at its exec (it never runs a line), prints the child's pid and waits
// for its stdin to close.
func Helper(args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("want base, size and limits, got %q", args)
	}
	base, err1 := strconv.ParseUint(args[0], 10, 32)
	size, err2 := strconv.ParseUint(args[1], 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("range: %w", err)
	}
	lim, err := parseLimits(args[2], Limits{})
	if err != nil {
		return err
	}
	for _, name := range sysctlNames {
		v, ok := lim[name]
		if !ok {
			continue
		}
		if name == "user_namespaces" {
			v = min(v+1, 1<<31-1)
		}
		err := os.WriteFile("/proc/sys/user/max_"+name, []byte(strconv.FormatInt(v, 10)), 0)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("set the box's max_%s: %w", name, err)
		}
	}
	for name, res := range rlimitResource {
		if v, ok := lim[name]; ok {
			if err := unix.Setrlimit(res, &unix.Rlimit{Cur: uint64(v), Max: uint64(v)}); err != nil {
				return fmt.Errorf("set the box's %s: %w", name, err)
			}
		}
	}
	runtime.LockOSThread() // the tracer of the child is this thread
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(base), Size: int(size)}}
	child := exec.Command("/proc/self/exe")
	child.Env = []string{}
	child.Dir = "/"
	child.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER,
		UidMappings: m, GidMappings: m, GidMappingsEnableSetgroups: true,
		Ptrace: true, Pdeathsig: unix.SIGKILL,
	}
	if err := child.Start(); err != nil {
		return fmt.Errorf("make the box's user namespace: %w", err)
	}
	defer func() {
		_ = child.Process.Kill()
		_ = child.Wait()
	}()
	if _, err := fmt.Printf("%d\n", child.Process.Pid); err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}
