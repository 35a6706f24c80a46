package ocibox

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestSeccompProfile(t *testing.T) {
	p := Seccomp()
	if p.DefaultAction != specs.ActErrno {
		t.Errorf("default action = %s, want errno", p.DefaultAction)
	}
	allowed := map[string]bool{}
	for _, rule := range p.Syscalls {
		if rule.Action == specs.ActAllow && len(rule.Args) == 0 {
			for _, n := range rule.Names {
				if allowed[n] {
					t.Errorf("syscall %s listed twice", n)
				}
				allowed[n] = true
			}
		}
	}
	for _, n := range []string{
		"pivot_root", "bpf", "perf_event_open", "kexec_load", "kexec_file_load",
		"init_module", "finit_module", "delete_module", "ptrace", "process_vm_writev", "keyctl", "add_key",
		"request_key", "userfaultfd", "unshare", "clone", "clone3", "personality", "open_by_handle_at",
		"name_to_handle_at", "reboot", "swapon", "syslog", "acct", "settimeofday", "clock_settime",
		"quotactl", "setns", "fanotify_init", "lookup_dcookie", "iopl", "ioperm", "vm86", "io_uring_setup",
		"fsopen", "open_tree", "move_mount", "socket",
	} {
		if allowed[n] {
			t.Errorf("%s allowed unconditionally", n)
		}
	}
	for _, n := range []string{"read", "write", "newfstatat", "execve", "wait4", "socketpair", "statx", "rseq"} {
		if !allowed[n] {
			t.Errorf("%s not allowed", n)
		}
	}
}

// TestSeccompRules checks the argument and errno rules of the spec's
// profile, the part the allowlist test above does not see.
func TestSeccompRules(t *testing.T) {
	p := Seccomp()
	if p.DefaultErrnoRet == nil || *p.DefaultErrnoRet != 1 {
		t.Errorf("default errno = %v, want EPERM (1)", p.DefaultErrnoRet)
	}
	enosys := uint(38)
	const nsFlags = 0x7e020000 // CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
	want := []specs.LinuxSyscall{
		{Names: []string{"clone"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: nsFlags, Op: specs.OpMaskedEqual}}},
		{Names: []string{"unshare"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: nsFlags | 0x80, Op: specs.OpMaskedEqual}}},
		{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: &enosys},
	}
	// AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET; not AF_VSOCK.
	for _, family := range []uint64{1, 2, 10, 16, 17} {
		want = append(want, specs.LinuxSyscall{Names: []string{"socket"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: family, Op: specs.OpEqualTo}}})
	}
	for _, persona := range []uint64{0x0, 0x8, 0x20000, 0x20008, 0xffffffff} {
		want = append(want, specs.LinuxSyscall{Names: []string{"personality"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: persona, Op: specs.OpEqualTo}}})
	}
	if len(p.Syscalls) == 0 {
		t.Fatal("no syscall rules")
	}
	if diff := cmp.Diff(want, p.Syscalls[1:]); diff != "" {
		t.Errorf("rules after the allowlist (-want +got):\n%s", diff)
	}
}
