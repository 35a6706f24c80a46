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

// boxNamespace makes box r's user namespace with limits lim (see Limits),
// bind-mounts it at path and returns its parent. It runs on a locked
// thread whose effective ids are r.Base, so the box's parent namespace is
// r.Base's: the helper (exe HelperArg ...) is cloned into that parent,
// which maps Canonical to r (so that it doubles as the namespace idmapped
// mounts shift canonical trees through), as r.Base with the capabilities
// it needs there in its ambient set. It sets the parent's limits, makes
// the box's namespace (0.. mapped to r through the parent) from a child it
// stops at its exec, and prints that child's pid; the parent is opened and
// the box's namespace bound from another thread, with the daemon's
// credentials. On success it returns, with the parent, end, which tells
// the helper to end by closing its stdin and reaps it: the caller calls it
// on this same thread once it has handed the parent on, so that nothing
// waits for it but the thread the helper's death signal is tied to stays
// until the helper has reaped its own child (else the child would be
// reparented to a subreaper such as the daemon, and left a zombie).
func boxNamespace(r Range, exe, path string, lim Limits) (parentNS *os.File, end func(), err error) {
	if err := setThreadIDs(int(r.Base), false); err != nil {
		return nil, nil, err
	}
	n := min(r.Size, Canonical.Size)
	parent := []syscall.SysProcIDMap{{ContainerID: int(Canonical.Base), HostID: int(r.Base), Size: int(n)}}
	cmd := exec.Command(exe, HelperArg, strconv.FormatUint(uint64(Canonical.Base), 10), strconv.FormatUint(uint64(n), 10), lim.String())
	cmd.Env = []string{}
	cmd.Dir = "/"
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER,
		UidMappings: parent, GidMappings: parent, GidMappingsEnableSetgroups: true,
		// Its own ids (not just effective ones), so that it stays
		// dumpable and may write its child's maps; its capabilities are
		// in the parent namespace only.
		Credential:  &syscall.Credential{Uid: Canonical.Base, Gid: Canonical.Base},
		AmbientCaps: []uintptr{unix.CAP_SETUID, unix.CAP_SETGID, unix.CAP_SYS_RESOURCE},
		Pdeathsig:   unix.SIGKILL,
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, fmt.Errorf("box user namespace helper: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, fmt.Errorf("box user namespace helper: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start box user namespace helper: %w", err)
	}
	// Whatever happens, the helper ends (it kills its child then) and is
	// reaped; on success in end.
	timer := time.AfterFunc(30*time.Second, func() { _ = cmd.Process.Kill() })
	end = func() {
		timer.Stop()
		_ = stdin.Close()
		_ = cmd.Wait()
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	pid, perr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || perr != nil || pid <= 0 {
		_ = cmd.Process.Kill()
		end()
		return nil, nil, fmt.Errorf("box user namespace helper: %q, %v: %s", line, err, strings.TrimSpace(stderr.String()))
	}
	type result struct {
		parent *os.File
		err    error
	}
	done := make(chan result, 1)
	go func() { // a thread with the daemon's credentials
		f, err := os.Open("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/user")
		if err != nil {
			done <- result{err: fmt.Errorf("open the box's parent user namespace: %w", err)}
			return
		}
		src := "/proc/" + strconv.Itoa(pid) + "/ns/user"
		if err := unix.Mount(src, path, "", unix.MS_BIND, ""); err != nil {
			f.Close()
			done <- result{err: fmt.Errorf("bind user namespace at %s: %w", path, err)}
			return
		}
		done <- result{parent: f}
	}()
	res := <-done
	if res.err != nil {
		end()
		return nil, nil, res.err
	}
	return res.parent, end, nil
}

// Helper is the helper's side of BoxNamespace, in the box's parent
// namespace: args are the box's range as the parent sees it (base and
// size) and the Limits. It writes
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
