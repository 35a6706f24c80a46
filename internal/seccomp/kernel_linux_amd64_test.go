package seccomp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// kernelChildEnv makes TestKernelChild install the default filter and
// report; only TestKernel sets it, in a child process.
const kernelChildEnv = "SBX_SECCOMP_TEST_CHILD"

// i386ProbeEnv names the i386 probe binary for the child; unset if the
// kernel runs no 32-bit syscalls (no IA32 emulation).
const i386ProbeEnv = "SBX_SECCOMP_TEST_I386"

// i386Probe is a minimal static x86_64 ELF that makes the i386 syscall
// getuid (24) through int 0x80, so with AUDIT_ARCH_I386, and exits with the
// low byte of its result: 255 means -EPERM (-1).
//
//	mov eax, 24; int 0x80; mov edi, eax; mov eax, 60; syscall
var i386Probe = func() []byte {
	code := []byte{0xb8, 24, 0, 0, 0, 0xcd, 0x80, 0x89, 0xc7, 0xb8, 60, 0, 0, 0, 0x0f, 0x05}
	const base, hdrs = 0x400000, 64 + 56
	size := uint64(hdrs + len(code))
	le := binary.LittleEndian
	b := make([]byte, 0, size)
	b = append(b, 0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0) // 64-bit, little-endian
	b = le.AppendUint16(b, 2)                                              // ET_EXEC
	b = le.AppendUint16(b, 0x3e)                                           // EM_X86_64
	b = le.AppendUint32(b, 1)                                              // EV_CURRENT
	b = le.AppendUint64(b, base+hdrs)                                      // entry
	b = le.AppendUint64(b, 64)                                             // phoff
	b = le.AppendUint64(b, 0)                                              // shoff
	b = le.AppendUint32(b, 0)                                              // flags
	b = le.AppendUint16(b, 64)                                             // ehsize
	b = le.AppendUint16(b, 56)                                             // phentsize
	b = le.AppendUint16(b, 1)                                              // phnum
	b = append(b, 0, 0, 0, 0, 0, 0)                                        // no sections
	b = le.AppendUint32(b, 1)                                              // PT_LOAD
	b = le.AppendUint32(b, 5)                                              // R+X
	b = le.AppendUint64(b, 0)                                              // offset
	b = le.AppendUint64(b, base)                                           // vaddr
	b = le.AppendUint64(b, base)                                           // paddr
	b = le.AppendUint64(b, size)                                           // filesz
	b = le.AppendUint64(b, size)                                           // memsz
	b = le.AppendUint64(b, 0x1000)                                         // align
	return append(b, code...)
}()

// runI386Probe runs the probe binary at path and returns its exit code.
func runI386Probe(path string) (int, error) {
	err := exec.Command(path).Run()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &exitErr) && exitErr.Exited():
		return exitErr.ExitCode(), nil
	}
	return 0, err
}

// probe is one real syscall made under the installed filter.
type probe struct {
	name string
	call func() error
	// want is the errno the call must fail with; 0 means it must succeed.
	want syscall.Errno
}

func rawErr(_, _ uintptr, e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// probes: without the filter each gets a different result (checked by
// hand: EINVAL, ESRCH, EOPNOTSUPP, success...), and none of them can create
// a child process or change anything outside the test's own child.
var probes = []probe{
	{"getpid", func() error { return rawErr(unix.Syscall(unix.SYS_GETPID, 0, 0, 0)) }, 0},
	// A multithreaded process gets EINVAL from the kernel for
	// CLONE_NEWUSER; the filter answers first.
	{"unshare CLONE_NEWUSER", func() error { return rawErr(unix.Syscall(unix.SYS_UNSHARE, unix.CLONE_NEWUSER, 0, 0)) }, unix.EPERM},
	{"unshare CLONE_NEWNS", func() error { return rawErr(unix.Syscall(unix.SYS_UNSHARE, unix.CLONE_NEWNS, 0, 0)) }, unix.EPERM},
	{"unshare 0", func() error { return rawErr(unix.Syscall(unix.SYS_UNSHARE, 0, 0, 0)) }, 0},
	// CLONE_FS with CLONE_NEWUSER is EINVAL in the kernel before anything
	// is created; the filter must say EPERM.
	{"clone CLONE_NEWUSER|CLONE_FS", func() error {
		return rawErr(unix.RawSyscall6(unix.SYS_CLONE, unix.CLONE_NEWUSER|unix.CLONE_FS, 0, 0, 0, 0, 0))
	}, unix.EPERM},
	// CLONE_THREAD without CLONE_SIGHAND is EINVAL in the kernel: the
	// filter let it through.
	{"clone CLONE_THREAD alone", func() error { return rawErr(unix.RawSyscall6(unix.SYS_CLONE, unix.CLONE_THREAD, 0, 0, 0, 0, 0)) }, unix.EINVAL},
	{"clone3", func() error { return rawErr(unix.Syscall(unix.SYS_CLONE3, 0, 0, 0)) }, unix.ENOSYS},
	{"bpf", func() error { return rawErr(unix.Syscall(unix.SYS_BPF, ^uintptr(0), 0, 0)) }, unix.EPERM},
	{"ptrace bad request", func() error { return rawErr(unix.Syscall6(unix.SYS_PTRACE, ^uintptr(0), 0, 0, 0, 0, 0)) }, unix.EPERM},
	{"keyctl", func() error { return rawErr(unix.Syscall(unix.SYS_KEYCTL, ^uintptr(0), 0, 0)) }, unix.EPERM},
	{"io_uring_setup", func() error { return rawErr(unix.Syscall(unix.SYS_IO_URING_SETUP, 0, 0, 0)) }, unix.EPERM},
	{"personality query", func() error { return rawErr(unix.Syscall(unix.SYS_PERSONALITY, 0xffffffff, 0, 0)) }, 0},
	// The kernel would truncate this to 0 (PER_LINUX), which is harmless.
	{"personality 0x1_0000_0000", func() error { return rawErr(unix.Syscall(unix.SYS_PERSONALITY, 1<<32, 0, 0)) }, unix.EPERM},
	{"personality READ_IMPLIES_EXEC", func() error { return rawErr(unix.Syscall(unix.SYS_PERSONALITY, 0x400000, 0, 0)) }, unix.EPERM},
	{"x32 getpid", func() error { return rawErr(unix.Syscall(unix.SYS_GETPID|0x40000000, 0, 0, 0)) }, unix.EPERM},
	{"unknown number 1000", func() error { return rawErr(unix.Syscall(1000, 0, 0, 0)) }, unix.EPERM},
	{"mount", func() error { // allowed by the profile; refused by the kernel without privilege or with a bad type
		return rawErr(unix.Syscall6(unix.SYS_MOUNT, 0, 0, 0, 0, 0, 0))
	}, unix.EFAULT},
	{"i386 getuid via int 0x80", func() error {
		path := os.Getenv(i386ProbeEnv)
		if path == "" {
			return errSkip
		}
		code, err := runI386Probe(path)
		switch {
		case err != nil:
			return err
		case code == 255:
			return unix.EPERM
		}
		return fmt.Errorf("i386 probe exited with %d (its uid's low byte, so the call went through)", code)
	}, unix.EPERM},
	{"exec /bin/true", func() error { return exec.Command("/bin/true").Run() }, 0},
	{"exec /bin/sh -c", func() error { return exec.Command("/bin/sh", "-c", "echo hi | cat >/dev/null").Run() }, 0},
}

var errSkip = errors.New("skipped")

// TestKernelChild runs in the child that TestKernel starts: it installs the
// compiled default profile on itself and reports each probe's errno.
func TestKernelChild(t *testing.T) {
	if os.Getenv(kernelChildEnv) != "1" {
		t.Skip("runs only in TestKernel's child")
	}
	prog, err := Compile(Default())
	if err != nil {
		fmt.Printf("compile-error %v\n", err)
		return
	}
	if err := Install(prog); err != nil {
		fmt.Printf("install-error %v\n", err)
		return
	}
	status, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "Seccomp:") || strings.HasPrefix(line, "NoNewPrivs:") {
			fmt.Printf("status %s\n", strings.Join(strings.Fields(line), " "))
		}
	}
	for i, p := range probes {
		err := p.call()
		var errno syscall.Errno
		var exitErr *exec.ExitError
		switch {
		case err == nil:
		case errors.Is(err, errSkip):
			fmt.Printf("probe %d skip\n", i)
			continue
		case errors.As(err, &errno):
		case errors.As(err, &exitErr):
			errno = syscall.Errno(1000 + exitErr.ExitCode())
		default:
			fmt.Printf("probe %d other %s\n", i, strings.ReplaceAll(err.Error(), "\n", " "))
			continue
		}
		fmt.Printf("probe %d %d\n", i, int(errno))
	}
}

// TestKernel installs the compiled default profile in a child process (the
// test binary again, unprivileged as far as seccomp goes: it relies on
// no_new_privs) and checks that real syscalls get the outcomes the
// interpreter tests promise.
func TestKernel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestKernelChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), kernelChildEnv+"=1")
	// The i386 probe, if this kernel runs 32-bit syscalls at all.
	probePath := filepath.Join(t.TempDir(), "i386probe")
	if err := os.WriteFile(probePath, i386Probe, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := runI386Probe(probePath); err != nil {
		t.Logf("no i386 probe: without a filter it fails: %v", err)
	} else {
		cmd.Env = append(cmd.Env, i386ProbeEnv+"="+probePath)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	got := map[int]syscall.Errno{}
	other := map[int]string{}
	skipped := map[int]bool{}
	status := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 1 && (f[0] == "compile-error" || f[0] == "install-error"):
			t.Fatalf("child: %s", sc.Text())
		case len(f) == 3 && f[0] == "status":
			status[f[1]] = f[2]
		case len(f) == 3 && f[0] == "probe" && f[2] == "skip":
			var i int
			fmt.Sscan(f[1], &i)
			skipped[i] = true
		case len(f) >= 3 && f[0] == "probe" && f[2] == "other":
			var i int
			fmt.Sscan(f[1], &i)
			other[i] = strings.Join(f[3:], " ")
		case len(f) == 3 && f[0] == "probe":
			var i, e int
			if _, err := fmt.Sscan(f[1]+" "+f[2], &i, &e); err != nil {
				t.Fatalf("child line %q: %v", sc.Text(), err)
			}
			got[i] = syscall.Errno(e)
		}
	}
	if status["Seccomp:"] != "2" || status["NoNewPrivs:"] != "1" {
		t.Errorf("child's status: Seccomp %q, NoNewPrivs %q; want 2 and 1\n%s", status["Seccomp:"], status["NoNewPrivs:"], out)
	}
	for i, p := range probes {
		if skipped[i] {
			t.Logf("%s: skipped", p.name)
			continue
		}
		if msg, ok := other[i]; ok {
			t.Errorf("%s: %s", p.name, msg)
			continue
		}
		e, ok := got[i]
		if !ok {
			t.Errorf("%s: no report from the child\n%s", p.name, out)
			continue
		}
		if e != p.want {
			t.Errorf("%s: got errno %d (%v), want %d (%v)", p.name, int(e), e, int(p.want), p.want)
		}
	}
}
