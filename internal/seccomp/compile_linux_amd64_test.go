package seccomp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// seccompData is struct seccomp_data.
type seccompData struct {
	nr   uint32
	arch uint32
	args [6]uint64
}

// bytes lays d out as the kernel does on x86_64 (little-endian).
func (d seccompData) bytes() []byte {
	b := make([]byte, 64)
	binary.LittleEndian.PutUint32(b[0:], d.nr)
	binary.LittleEndian.PutUint32(b[4:], d.arch)
	// instruction_pointer (8 bytes at 8) stays 0
	for i, a := range d.args {
		binary.LittleEndian.PutUint64(b[16+8*i:], a)
	}
	return b
}

// interpret runs prog over d with a tiny classic BPF interpreter that knows
// only the opcodes Compile emits; it returns the filter's return value and
// the number of instructions executed.
func interpret(prog []unix.SockFilter, d seccompData) (ret uint32, steps int, err error) {
	data := d.bytes()
	var a uint32
	pc := 0
	for {
		if pc < 0 || pc >= len(prog) {
			return 0, steps, fmt.Errorf("pc %d outside the program (%d instructions)", pc, len(prog))
		}
		in := prog[pc]
		steps++
		cond := func(ok bool) {
			if ok {
				pc += 1 + int(in.Jt)
			} else {
				pc += 1 + int(in.Jf)
			}
		}
		switch in.Code {
		case ldAbs:
			if in.K%4 != 0 || in.K+4 > uint32(len(data)) {
				return 0, steps, fmt.Errorf("pc %d: bad load offset %d", pc, in.K)
			}
			a = binary.LittleEndian.Uint32(data[in.K:])
			pc++
		case jeqK:
			cond(a == in.K)
		case jgeK:
			cond(a >= in.K)
		case jsetK:
			cond(a&in.K != 0)
		case ja:
			pc += 1 + int(in.K)
		case retK:
			return in.K, steps, nil
		default:
			return 0, steps, fmt.Errorf("pc %d: unexpected opcode %#x", pc, in.Code)
		}
	}
}

const (
	retAllow  = unix.SECCOMP_RET_ALLOW
	retEPERM  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retENOSYS = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
)

func retName(r uint32) string {
	switch {
	case r == retAllow:
		return "ALLOW"
	case r&unix.SECCOMP_RET_ACTION_FULL == unix.SECCOMP_RET_ERRNO:
		return fmt.Sprintf("ERRNO(%d)", r&unix.SECCOMP_RET_DATA)
	}
	return fmt.Sprintf("%#x", r)
}

func compileDefault(t testing.TB) []unix.SockFilter {
	t.Helper()
	prog, err := Compile(Default())
	if err != nil {
		t.Fatalf("Compile(Default()): %v", err)
	}
	return prog
}

func x86(nr uint32, args ...uint64) seccompData {
	d := seccompData{nr: nr, arch: unix.AUDIT_ARCH_X86_64}
	copy(d.args[:], args)
	return d
}

func TestCompileDefaultAllowsEveryAllowedName(t *testing.T) {
	prog := compileDefault(t)
	n := 0
	for _, name := range Default().Allow {
		nr, ok := amd64Numbers[name]
		if !ok {
			continue
		}
		n++
		got, _, err := interpret(prog, x86(nr, ^uint64(0), ^uint64(0)))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got != retAllow {
			t.Errorf("%s (%d): got %s, want ALLOW", name, nr, retName(got))
		}
	}
	if n < 250 {
		t.Errorf("only %d allowed names have an x86_64 number, want >= 250", n)
	}
}

func TestCompileDefaultCases(t *testing.T) {
	const (
		cloneThread = 0x3d0f00 // what glibc's pthread_create passes
		newUser     = unix.CLONE_NEWUSER
		newNet      = unix.CLONE_NEWNET
	)
	prog := compileDefault(t)
	for _, tc := range []struct {
		name string
		d    seccompData
		want uint32
	}{
		{"bpf", x86(unix.SYS_BPF), retEPERM},
		{"ptrace", x86(unix.SYS_PTRACE), retEPERM},
		{"keyctl", x86(unix.SYS_KEYCTL), retEPERM},
		{"add_key", x86(unix.SYS_ADD_KEY), retEPERM},
		{"io_uring_setup", x86(unix.SYS_IO_URING_SETUP), retEPERM},
		{"pivot_root", x86(unix.SYS_PIVOT_ROOT), retEPERM},
		{"open_tree", x86(unix.SYS_OPEN_TREE), retEPERM},
		{"move_mount", x86(unix.SYS_MOVE_MOUNT), retEPERM},
		{"fsopen", x86(unix.SYS_FSOPEN), retEPERM},
		{"kexec_load", x86(unix.SYS_KEXEC_LOAD), retEPERM},
		{"init_module", x86(unix.SYS_INIT_MODULE), retEPERM},
		{"setns", x86(unix.SYS_SETNS), retEPERM},
		{"userfaultfd", x86(unix.SYS_USERFAULTFD), retEPERM},
		{"perf_event_open", x86(unix.SYS_PERF_EVENT_OPEN), retEPERM},
		{"reboot", x86(unix.SYS_REBOOT), retEPERM},
		{"process_vm_readv", x86(unix.SYS_PROCESS_VM_READV), retEPERM},
		{"open_by_handle_at", x86(unix.SYS_OPEN_BY_HANDLE_AT), retEPERM},
		{"clone3", x86(unix.SYS_CLONE3), retENOSYS},
		{"clone3 with args", x86(unix.SYS_CLONE3, 0x1234, 88), retENOSYS},
		{"clone thread flags", x86(unix.SYS_CLONE, cloneThread), retAllow},
		{"clone fork", x86(unix.SYS_CLONE, uint64(unix.SIGCHLD)), retAllow},
		{"clone vfork|vm|pidfd", x86(unix.SYS_CLONE, unix.CLONE_VFORK|unix.CLONE_VM|unix.CLONE_PIDFD|uint64(unix.SIGCHLD)), retAllow},
		{"clone CLONE_NEWUSER", x86(unix.SYS_CLONE, newUser|uint64(unix.SIGCHLD)), retEPERM},
		{"clone CLONE_NEWNET", x86(unix.SYS_CLONE, newNet|cloneThread), retEPERM},
		{"clone CLONE_NEWNS", x86(unix.SYS_CLONE, unix.CLONE_NEWNS), retEPERM},
		{"clone CLONE_NEWPID", x86(unix.SYS_CLONE, unix.CLONE_NEWPID), retEPERM},
		{"clone CLONE_NEWCGROUP", x86(unix.SYS_CLONE, unix.CLONE_NEWCGROUP), retEPERM},
		{"clone flags high word set", x86(unix.SYS_CLONE, 1<<32|uint64(unix.SIGCHLD)), retAllow},
		{"unshare CLONE_NEWNS", x86(unix.SYS_UNSHARE, unix.CLONE_NEWNS), retEPERM},
		{"unshare CLONE_NEWTIME", x86(unix.SYS_UNSHARE, unix.CLONE_NEWTIME), retEPERM},
		{"unshare CLONE_NEWUTS|FILES", x86(unix.SYS_UNSHARE, unix.CLONE_NEWUTS|unix.CLONE_FILES), retEPERM},
		{"unshare CLONE_FILES", x86(unix.SYS_UNSHARE, unix.CLONE_FILES), retAllow},
		{"unshare 0", x86(unix.SYS_UNSHARE, 0), retAllow},
		{"socket AF_UNIX", x86(unix.SYS_SOCKET, unix.AF_UNIX), retAllow},
		{"socket AF_INET", x86(unix.SYS_SOCKET, unix.AF_INET), retAllow},
		{"socket AF_INET6", x86(unix.SYS_SOCKET, unix.AF_INET6), retAllow},
		{"socket AF_NETLINK", x86(unix.SYS_SOCKET, unix.AF_NETLINK), retAllow},
		{"socket AF_PACKET", x86(unix.SYS_SOCKET, unix.AF_PACKET), retAllow},
		{"socket AF_VSOCK", x86(unix.SYS_SOCKET, unix.AF_VSOCK), retEPERM},
		{"socket AF_ALG", x86(unix.SYS_SOCKET, unix.AF_ALG), retEPERM},
		{"socket AF_VSOCK in the low half", x86(unix.SYS_SOCKET, 0x1_0000_0000|unix.AF_VSOCK), retEPERM},
		{"socket AF_INET with high bits", x86(unix.SYS_SOCKET, 0x1_0000_0000|unix.AF_INET), retEPERM},
		{"personality 0", x86(unix.SYS_PERSONALITY, 0), retAllow},
		{"personality 8", x86(unix.SYS_PERSONALITY, 8), retAllow},
		{"personality 0x20000", x86(unix.SYS_PERSONALITY, 0x20000), retAllow},
		{"personality 0x20008", x86(unix.SYS_PERSONALITY, 0x20008), retAllow},
		{"personality 0xffffffff", x86(unix.SYS_PERSONALITY, 0xffffffff), retAllow},
		{"personality 0x1_0000_0000", x86(unix.SYS_PERSONALITY, 0x1_0000_0000), retEPERM},
		{"personality 0xffffffff_ffffffff", x86(unix.SYS_PERSONALITY, ^uint64(0)), retEPERM},
		{"personality 0x1_0000_0008", x86(unix.SYS_PERSONALITY, 0x1_0000_0008), retEPERM},
		{"personality READ_IMPLIES_EXEC", x86(unix.SYS_PERSONALITY, 0x400000), retEPERM},
		{"personality ADDR_NO_RANDOMIZE", x86(unix.SYS_PERSONALITY, 0x0040000), retEPERM},
		{"personality 1", x86(unix.SYS_PERSONALITY, 1), retEPERM},
		{"getpid", x86(unix.SYS_GETPID), retAllow},
		{"read", x86(unix.SYS_READ), retAllow},
		{"mseal", x86(unix.SYS_MSEAL), retAllow},
		{"removexattrat", x86(unix.SYS_REMOVEXATTRAT), retAllow},
		{"open_tree_attr (past the last allowed)", x86(unix.SYS_OPEN_TREE_ATTR), retEPERM},
		{"number 0xffffffff", x86(0xffffffff), retEPERM},
		{"number 1000", x86(1000), retEPERM},
		{"x32 getpid", x86(unix.SYS_GETPID | 0x40000000), retEPERM},
		{"x32 read", x86(0x40000000), retEPERM},
		{"i386 getpid", seccompData{nr: 20, arch: unix.AUDIT_ARCH_I386}, retEPERM},
		{"i386 read", seccompData{nr: 3, arch: unix.AUDIT_ARCH_I386}, retEPERM},
		{"aarch64 getpid", seccompData{nr: 172, arch: unix.AUDIT_ARCH_AARCH64}, retEPERM},
		{"arch 0", seccompData{nr: unix.SYS_GETPID}, retEPERM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := interpret(prog, tc.d)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %s, want %s", retName(got), retName(tc.want))
			}
		})
	}
}

// TestCompileDefaultDeniesTheRest sweeps every number up to 600 that the
// profile does not name.
func TestCompileDefaultDeniesTheRest(t *testing.T) {
	p := Default()
	named := map[uint32]bool{}
	for _, n := range p.Allow {
		if nr, ok := amd64Numbers[n]; ok {
			named[nr] = true
		}
	}
	for _, r := range p.Rules {
		if r.Op != OpErrno {
			named[amd64Numbers[r.Name]] = true
		}
	}
	prog := compileDefault(t)
	for nr := uint32(0); nr <= 600; nr++ {
		if named[nr] {
			continue
		}
		want := uint32(retEPERM)
		if nr == unix.SYS_CLONE3 {
			want = retENOSYS
		}
		got, _, err := interpret(prog, x86(nr))
		if err != nil {
			t.Fatalf("nr %d: %v", nr, err)
		}
		if got != want {
			t.Errorf("nr %d: got %s, want %s", nr, retName(got), retName(want))
		}
	}
}

// checkStructure asserts what the kernel's checker would: a length within
// the limit, jumps that land inside the program, a return at the end,
// aligned loads inside seccomp_data.
func checkStructure(t *testing.T, prog []unix.SockFilter) {
	t.Helper()
	if len(prog) == 0 || len(prog) > MaxInstructions {
		t.Fatalf("got %d instructions, want 1-%d", len(prog), MaxInstructions)
	}
	if last := prog[len(prog)-1]; last.Code != retK {
		t.Errorf("last instruction %+v, want a return", last)
	}
	for pc, in := range prog {
		switch in.Code {
		case ldAbs:
			if in.K%4 != 0 || in.K > 60 {
				t.Errorf("pc %d: load offset %d outside seccomp_data", pc, in.K)
			}
		case jeqK, jgeK, jsetK:
			if end := pc + 1 + max(int(in.Jt), int(in.Jf)); end >= len(prog) {
				t.Errorf("pc %d: jump to %d, past the end (%d)", pc, end, len(prog))
			}
		case ja:
			if end := pc + 1 + int(in.K); end >= len(prog) {
				t.Errorf("pc %d: ja to %d, past the end (%d)", pc, end, len(prog))
			}
		case retK:
		default:
			t.Errorf("pc %d: unexpected opcode %#x", pc, in.Code)
		}
	}
}

func TestCompileDefaultStructure(t *testing.T) {
	prog := compileDefault(t)
	checkStructure(t, prog)
	worst := 0
	for nr := uint32(0); nr <= 1000; nr++ {
		for _, arg := range []uint64{0, 8, 0xffffffff, 1 << 32, ^uint64(0), unix.CLONE_NEWUSER} {
			_, steps, err := interpret(prog, x86(nr, arg))
			if err != nil {
				t.Fatal(err)
			}
			worst = max(worst, steps)
		}
	}
	_, getpid, _ := interpret(prog, x86(unix.SYS_GETPID))
	t.Logf("default profile: %d instructions; executed per syscall: getpid %d, worst %d", len(prog), getpid, worst)
	if worst > 40 {
		t.Errorf("worst case executes %d instructions, want <= 40", worst)
	}
}

// amd64Names maps x86_64 syscall numbers to names.
var amd64Names = func() map[uint32]string {
	m := make(map[uint32]string, len(amd64Numbers))
	for n, nr := range amd64Numbers {
		m[nr] = n
	}
	return m
}()

// evaluate is the reference semantics of a Profile on x86_64.
func evaluate(p Profile, d seccompData) uint32 {
	deflt := unix.SECCOMP_RET_ERRNO | p.DefaultErrno
	if d.arch != unix.AUDIT_ARCH_X86_64 || d.nr&0x40000000 != 0 {
		return deflt
	}
	name, ok := amd64Names[d.nr]
	if !ok {
		return deflt
	}
	for _, n := range p.Allow {
		if n == name {
			return retAllow
		}
	}
	for _, r := range p.Rules {
		if r.Name != name {
			continue
		}
		switch r.Op {
		case OpErrno:
			return unix.SECCOMP_RET_ERRNO | r.Errno
		case OpMaskedZero:
			if d.args[r.Index]&r.Value == 0 {
				return retAllow
			}
		case OpEqual:
			if d.args[r.Index] == r.Value {
				return retAllow
			}
		}
	}
	return deflt
}

// TestCompileRandomProfiles compares compiled random profiles, big enough
// to need ja trampolines, with the reference semantics.
func TestCompileRandomProfiles(t *testing.T) {
	names := make([]string, 0, len(amd64Numbers))
	for n := range amd64Numbers {
		names = append(names, n)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	values := []uint64{0, 1, 8, 0xff, 0xffffffff, 1 << 32, 1<<32 | 8, ^uint64(0), 0x7e020000, 0x80000000_00000000}
	sawTrampoline := false
	for i := range 40 {
		p := Profile{DefaultErrno: uint32(1 + rng.IntN(4095))}
		for _, n := range names {
			switch rng.IntN(6) {
			case 0, 1, 2:
				p.Allow = append(p.Allow, n)
			case 3:
				p.Rules = append(p.Rules, Rule{Name: n, Op: OpErrno, Errno: uint32(1 + rng.IntN(4095))})
			case 4:
				for range 1 + rng.IntN(12) {
					op := OpEqual
					if rng.IntN(2) == 0 {
						op = OpMaskedZero
					}
					p.Rules = append(p.Rules, Rule{Name: n, Op: op, Index: uint(rng.IntN(6)), Value: values[rng.IntN(len(values))]})
				}
			}
		}
		rng.Shuffle(len(p.Rules), func(a, b int) { p.Rules[a], p.Rules[b] = p.Rules[b], p.Rules[a] })
		prog, err := Compile(p)
		if err != nil {
			t.Fatalf("profile %d: %v", i, err)
		}
		checkStructure(t, prog)
		for _, in := range prog {
			sawTrampoline = sawTrampoline || in.Code == ja
		}
		for nr := uint32(0); nr <= 520; nr++ {
			for range 4 {
				var d seccompData
				d.nr, d.arch = nr, unix.AUDIT_ARCH_X86_64
				for j := range d.args {
					d.args[j] = values[rng.IntN(len(values))]
				}
				got, _, err := interpret(prog, d)
				if err != nil {
					t.Fatalf("profile %d, nr %d: %v", i, nr, err)
				}
				if want := evaluate(p, d); got != want {
					t.Fatalf("profile %d, nr %d, args %#x: got %s, want %s", i, nr, d.args, retName(got), retName(want))
				}
			}
		}
	}
	if !sawTrampoline {
		t.Error("no random profile needed a ja trampoline; make them bigger")
	}
}

func TestCompileErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Profile
		want string
	}{
		{"typo in the allowlist", Profile{DefaultErrno: 1, Allow: []string{"read", "wrtie"}}, `unknown syscall "wrtie"`},
		{"unknown rule name", Profile{DefaultErrno: 1, Rules: []Rule{{Name: "clone4", Op: OpErrno, Errno: 38}}}, `unknown syscall "clone4"`},
		{"no default errno", Profile{Allow: []string{"read"}}, "default errno 0"},
		{"default errno too big", Profile{DefaultErrno: 4096}, "default errno 4096"},
		{"allowed twice", Profile{DefaultErrno: 1, Allow: []string{"read", "read"}}, "read is allowed twice"},
		{"empty name", Profile{DefaultErrno: 1, Allow: []string{""}}, "empty syscall name"},
		{"allowed and ruled", Profile{DefaultErrno: 1, Allow: []string{"clone"}, Rules: []Rule{{Name: "clone", Op: OpEqual}}}, "also allowed unconditionally"},
		{"argument index 6", Profile{DefaultErrno: 1, Rules: []Rule{{Name: "clone", Op: OpEqual, Index: 6}}}, "argument index 6"},
		{"errno 0", Profile{DefaultErrno: 1, Rules: []Rule{{Name: "clone3", Op: OpErrno}}}, "errno 0 is not in"},
		{"errno and allow rule", Profile{DefaultErrno: 1, Rules: []Rule{{Name: "clone", Op: OpEqual}, {Name: "clone", Op: OpErrno, Errno: 1}}}, "cannot be combined"},
		{"two errno rules", Profile{DefaultErrno: 1, Rules: []Rule{{Name: "clone3", Op: OpErrno, Errno: 38}, {Name: "clone3", Op: OpErrno, Errno: 1}}}, "cannot be combined"},
		{"unknown op", Profile{DefaultErrno: 1, Rules: []Rule{{Name: "clone", Op: 9}}}, "unknown op"},
		{"errno on an allow rule", Profile{DefaultErrno: 1, Rules: []Rule{{Name: "clone", Op: OpEqual, Errno: 1}}}, "errno 1 set on an allow rule"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Compile(tc.p)
			if err == nil {
				t.Fatalf("got no error, want one containing %q", tc.want)
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("got %v, want an ErrInvalidArgument", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestCompileSkipsOtherArchNames(t *testing.T) {
	prog, err := Compile(Profile{DefaultErrno: 1, Allow: []string{"mmap2", "getpid"}, Rules: []Rule{{Name: "socketcall", Op: OpErrno, Errno: 38}}})
	if err != nil {
		t.Fatal(err)
	}
	if got, _, _ := interpret(prog, x86(unix.SYS_GETPID)); got != retAllow {
		t.Errorf("getpid: got %s, want ALLOW", retName(got))
	}
}

// TestTable checks the name table against the kernel's numbers the brief
// cites and the absent list against the table.
func TestTable(t *testing.T) {
	for name, want := range map[string]uint32{
		"read": 0, "getpid": 39, "clone": 56, "clone3": 435, "cachestat": 451, "fchmodat2": 452,
		"map_shadow_stack": 453, "futex_wake": 454, "futex_wait": 455, "futex_requeue": 456,
		"mseal": 462, "setxattrat": 463, "getxattrat": 464, "listxattrat": 465, "removexattrat": 466,
	} {
		if got, ok := amd64Numbers[name]; !ok || got != want {
			t.Errorf("amd64Numbers[%s] = %d, %v; want %d", name, got, ok, want)
		}
	}
	seen := map[uint32]string{}
	for name, nr := range amd64Numbers {
		if other, dup := seen[nr]; dup {
			t.Errorf("%s and %s both have number %d", name, other, nr)
		}
		seen[nr] = name
		if nativeAbsent[name] {
			t.Errorf("%s has x86_64 number %d but is listed as absent", name, nr)
		}
	}
}

// TestNativeNames checks what the OCI spec's allowlist keeps on amd64.
func TestNativeNames(t *testing.T) {
	allow := Default().Allow
	all := setOf(allow...)
	for n := range nativeAbsent {
		if !all[n] {
			t.Errorf("nativeAbsent lists %s, which the default profile does not name", n)
		}
	}
	kept := setOf(NativeNames(allow)...)
	// x86_64 syscalls (some newer than the host's libseccomp) stay listed.
	for _, n := range []string{"read", "futex", "futex_wait", "futex_waitv", "mseal", "fchmodat2", "cachestat", "map_shadow_stack", "setxattrat", "getdents64", "sendfile", "fadvise64"} {
		if !all[n] {
			t.Fatalf("%s not in the default allowlist", n)
		}
		if !kept[n] {
			t.Errorf("%s exists on x86_64 but NativeNames dropped it", n)
		}
	}
	for _, n := range allow {
		_, hasNr := amd64Numbers[n]
		if kept[n] != hasNr {
			t.Errorf("%s: kept %v, want %v (has an x86_64 number: %v)", n, kept[n], hasNr, hasNr)
		}
	}
}

func BenchmarkCompile(b *testing.B) {
	p := Default()
	for b.Loop() {
		if _, err := Compile(p); err != nil {
			b.Fatal(err)
		}
	}
}
