package seccomp

import (
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// MaxInstructions is the kernel's limit on a classic BPF program's length
// (BPF_MAXINSNS).
const MaxInstructions = 4096

// archTable describes the native architecture to the compiler.
type archTable struct {
	name    string
	audit   uint32            // seccomp_data.arch of native syscalls
	numbers map[string]uint32 // every syscall of the arch
	absent  map[string]bool   // known syscalls of other arches/ABIs
	abiBit  uint32            // syscall numbers with this bit are another ABI (0: none)
}

// The layout of struct seccomp_data.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16 // args[i] at 16+8*i, 64 bits, native byte order
)

// Instructions used.
const (
	ldAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	jeqK  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	jgeK  = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
	jsetK = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	ja    = unix.BPF_JMP | unix.BPF_JA
	retK  = unix.BPF_RET | unix.BPF_K
)

// maxJump is the longest conditional jump (jt and jf are 8 bits).
const maxJump = 255

// Compile translates p to a classic BPF program for seccomp on the native
// architecture (amd64 only so far; ErrUnsupportedArch elsewhere).
//
// The program first checks seccomp_data.arch: a syscall made through
// another ABI (int 0x80 on x86_64, i.e. AUDIT_ARCH_I386) gets the default
// errno, and so does one with the x32 bit set. We chose the default errno
// over SECCOMP_RET_KILL_PROCESS (libseccomp's default for a foreign arch):
// neither lets the syscall reach the kernel's compat syscall code, which is
// what matters, and the errno, which every other refused syscall gets too,
// keeps a process that probes compat syscalls (a 32-bit helper, a feature
// test) alive and debuggable instead of dying without a trace. Nothing is
// allowed through a compat ABI, so a 32-bit program cannot work anyway.
//
// It then finds the syscall's outcome by a balanced binary search over the
// syscall numbers: runs of consecutive numbers with the same outcome are
// merged into intervals, each split is one jge, and each leaf is a return
// (or, for syscalls with argument rules, a short run of 64-bit checks), so a
// syscall costs about log2(intervals) jumps. Jumps longer than the 8-bit
// offsets of conditional jumps go through a ja.
//
// Names with no number on the architecture are skipped, as libseccomp does;
// a name unknown on every architecture is an error wrapping
// errdefs.ErrInvalidArgument, so a typo cannot silently drop a syscall.
func Compile(p Profile) ([]unix.SockFilter, error) {
	if native == nil {
		return nil, ErrUnsupportedArch
	}
	return compile(p, native)
}

// outcome is what the filter does with one syscall number.
type outcome struct {
	ret   uint32 // SECCOMP_RET_* value, if conds is empty
	conds []Rule // allow rules, tried in order; then the default
}

func compile(p Profile, arch *archTable) ([]unix.SockFilter, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	deflt := unix.SECCOMP_RET_ERRNO | p.DefaultErrno
	byNr := make(map[uint32]*outcome, len(p.Allow)+len(p.Rules))
	allow := &outcome{ret: unix.SECCOMP_RET_ALLOW} // shared: never modified
	resolve := func(name string) (uint32, bool, error) {
		if nr, ok := arch.numbers[name]; ok {
			return nr, true, nil
		}
		if arch.absent[name] {
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("compiling seccomp profile for %s: unknown syscall %q: %w", arch.name, name, errdefs.ErrInvalidArgument)
	}
	for _, n := range p.Allow {
		nr, ok, err := resolve(n)
		if err != nil {
			return nil, err
		}
		if ok {
			byNr[nr] = allow
		}
	}
	for _, r := range p.Rules {
		nr, ok, err := resolve(r.Name)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		if r.Op == OpErrno {
			byNr[nr] = &outcome{ret: unix.SECCOMP_RET_ERRNO | r.Errno}
			continue
		}
		o := byNr[nr]
		if o == nil {
			o = &outcome{}
			byNr[nr] = o
		}
		o.conds = append(o.conds, r)
	}
	nrs := make([]uint32, 0, len(byNr))
	for nr := range byNr {
		if arch.abiBit != 0 && nr&arch.abiBit != 0 {
			return nil, fmt.Errorf("compiling seccomp profile for %s: syscall number %#x has the ABI bit set", arch.name, nr)
		}
		nrs = append(nrs, nr)
	}
	slices.Sort(nrs)
	segs := intervals(nrs, byNr, deflt)

	prog := []unix.SockFilter{
		{Code: ldAbs, K: offArch},
		{Code: jeqK, Jt: 1, Jf: 0, K: arch.audit},
		{Code: retK, K: deflt},
		{Code: ldAbs, K: offNr},
	}
	if arch.abiBit != 0 {
		prog = append(prog,
			unix.SockFilter{Code: jsetK, Jt: 0, Jf: 1, K: arch.abiBit},
			unix.SockFilter{Code: retK, K: deflt},
		)
	}
	prog = append(prog, search(segs, deflt)...)
	if len(prog) > MaxInstructions {
		return nil, fmt.Errorf("compiling seccomp profile for %s: %d instructions, more than the kernel's %d: %w", arch.name, len(prog), MaxInstructions, errdefs.ErrInvalidArgument)
	}
	return prog, nil
}

// segment is the interval of syscall numbers from lo up to the next
// segment's lo, all with the same outcome.
type segment struct {
	lo  uint32
	out *outcome
}

// intervals covers [0, 2^32) with segments: the numbers of byNr (sorted in
// nrs) and the gaps between them, which get the default; neighbours with the
// same plain return are merged into one segment.
func intervals(nrs []uint32, byNr map[uint32]*outcome, deflt uint32) []segment {
	def := &outcome{ret: deflt}
	var segs []segment
	add := func(lo uint32, o *outcome) {
		if n := len(segs); n > 0 && sameReturn(segs[n-1].out, o) {
			return
		}
		segs = append(segs, segment{lo: lo, out: o})
	}
	next, full := uint32(0), false // next: the first number not covered yet
	for _, nr := range nrs {
		if nr > next {
			add(next, def)
		}
		add(nr, byNr[nr])
		next = nr + 1
		full = next == 0 // nr was the largest number
	}
	if !full {
		add(next, def)
	}
	return segs
}

// sameReturn reports whether a and b are the same plain return.
func sameReturn(a, b *outcome) bool {
	return len(a.conds) == 0 && len(b.conds) == 0 && a.ret == b.ret
}

// search emits a balanced binary search over segs (sorted, covering all
// numbers) with the syscall number in A. Every path ends in a return.
func search(segs []segment, deflt uint32) []unix.SockFilter {
	if len(segs) == 1 {
		return leaf(segs[0].out, deflt)
	}
	m := len(segs) / 2
	left := search(segs[:m], deflt)
	right := search(segs[m:], deflt)
	var code []unix.SockFilter
	if len(left) <= maxJump {
		code = make([]unix.SockFilter, 0, 1+len(left)+len(right))
		code = append(code, unix.SockFilter{Code: jgeK, Jt: uint8(len(left)), Jf: 0, K: segs[m].lo})
	} else {
		code = make([]unix.SockFilter, 0, 2+len(left)+len(right))
		code = append(code,
			unix.SockFilter{Code: jgeK, Jt: 0, Jf: 1, K: segs[m].lo},
			unix.SockFilter{Code: ja, K: uint32(len(left))},
		)
	}
	code = append(code, left...)
	return append(code, right...)
}

// leaf emits the code for one outcome. Argument rules reload A, which is
// fine: every path out of a leaf is a return.
func leaf(o *outcome, deflt uint32) []unix.SockFilter {
	if len(o.conds) == 0 {
		return []unix.SockFilter{{Code: retK, K: o.ret}}
	}
	var code []unix.SockFilter
	for _, c := range o.conds {
		code = append(code, argCheck(c)...)
	}
	return append(code, unix.SockFilter{Code: retK, K: deflt})
}

// argCheck emits one allow rule: it returns ALLOW if the rule holds and
// falls through past its end otherwise. Both 32-bit halves of the 64-bit
// argument are checked (args are little-endian on every architecture we
// have a table for: low word first).
func argCheck(r Rule) []unix.SockFilter {
	lo := uint32(offArgs + 8*r.Index)
	hi := lo + 4
	type step struct {
		off  uint32
		code uint16
		k    uint32
	}
	var steps []step
	switch r.Op {
	case OpMaskedZero:
		// fail if any masked bit is set
		if m := uint32(r.Value >> 32); m != 0 {
			steps = append(steps, step{hi, jsetK, m})
		}
		if m := uint32(r.Value); m != 0 {
			steps = append(steps, step{lo, jsetK, m})
		}
	case OpEqual:
		// fail if a half differs
		steps = append(steps, step{hi, jeqK, uint32(r.Value >> 32)}, step{lo, jeqK, uint32(r.Value)})
	}
	// Each step is a load and a jump; the block ends with ret ALLOW, and
	// "fail" means jumping just past it.
	n := 2*len(steps) + 1
	code := make([]unix.SockFilter, 0, n)
	for _, s := range steps {
		code = append(code, unix.SockFilter{Code: ldAbs, K: s.off})
		fail := uint8(n - len(code) - 1) // from the jump to past the block
		j := unix.SockFilter{Code: s.code, K: s.k}
		if s.code == jsetK {
			j.Jt = fail // a masked bit is set
		} else {
			j.Jf = fail // not equal
		}
		code = append(code, j)
	}
	return append(code, unix.SockFilter{Code: retK, K: unix.SECCOMP_RET_ALLOW})
}
