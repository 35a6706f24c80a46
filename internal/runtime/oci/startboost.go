//go:build linux

package oci

import (
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"sync"

	"github.com/sbxdev/sbx/internal/runtime/ocibox"
)

// A box starts at full weight. All boxes together weigh little against the
// host's processes (Config.BoxesCPUShares, 128 by default: an eighth of one
// busy process), and each box weighs by its CPUs among the others; a box's
// start (the runtime's init, then the agent up to ready) runs in its cgroup,
// so on a host with other load, or beside busy boxes, every create crawled:
// `runc run` of /bin/true in a 128-share parent took 4-5x as long as at the
// root while other processes kept the 2-core VM busy (median ~300 ms against
// ~70 ms, measured 2026-11-25). Nothing of the user's runs before the agent
// says it is ready (commands start after Create returns), so:
//
//   - each box is created with startShares, and set to its own weight (its
//     CPUs) once its agent is ready, before Create returns: among the boxes
//     a starting one comes first;
//   - while boxes start, the parent weighs boxesShares plus one busy host
//     process (1024) per start in flight (up to the host's CPUs), and goes
//     back to boxesShares when none is: the starts get their share of the
//     host, and what busy boxes gain meanwhile is bounded by the weight the
//     starting ones leave idle.
//
// The CPU quota (the box's CPUs) holds throughout.

// testHookStarted, if set, is called by Create once the runtime has
// started a box, before its agent is ready (while it starts boosted).
var testHookStarted func(id string)

// startBoost counts the starts in flight and weighs the parent for them.
type startBoost struct {
	cg   cgroupLayout
	base uint64

	mu sync.Mutex
	// n is the starts in flight; guarded by mu, as are the writes of the
	// parent's weight, so that they land in order.
	n int
}

// sharesLocked is the parent's weight for the starts in flight: one busy
// host process more per start, for at most as many starts as the host has
// CPUs (more could not run at once anyway), so that a flood of creates
// cannot lift the boxes' weight further.
func (b *startBoost) sharesLocked() uint64 {
	return min(startShares, b.base+1024*uint64(min(b.n, goruntime.NumCPU())))
}

// reset puts the parent's weight back to base if the parent exists: a
// daemon killed during a start left it lifted, and it stays so until a
// create ends otherwise.
func (b *startBoost) reset() error {
	dir, _ := b.cg.controllerDir("cpu", "")
	if _, err := os.Stat(dir); err != nil {
		return nil // made with the first create's weight
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cg.boxesCPUWeight(b.sharesLocked())
}

// begin counts a start and raises the parent's weight; call end after it,
// whatever happened.
func (b *startBoost) begin() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n++
	if err := b.cg.boxesCPUWeight(b.sharesLocked()); err != nil {
		b.n--
		return err
	}
	return nil
}

// end counts a start out and lowers the parent's weight back.
func (b *startBoost) end() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n--
	return b.cg.boxesCPUWeight(b.sharesLocked())
}

// setBoxWeight sets box id's CPU weight among boxes to what its CPUs give
// (cpuShares; the kernel's default when it has no CPU limit), ending its
// start's precedence.
func (l cgroupLayout) setBoxWeight(id string, cpuMillis int64) error {
	dir, v2 := l.controllerDir("cpu", id)
	file, val := "cpu.shares", uint64(1024)
	if cpuMillis > 0 {
		val = cpuShares(cpuMillis)
	}
	if v2 {
		// runc's conversion of the shares Create would have given; the
		// default weight when there are none.
		file, val = "cpu.weight", 100
		if cpuMillis > 0 {
			val = 1 + (cpuShares(cpuMillis)-2)*9999/262142
		}
	}
	if err := ocibox.WriteCgroupFile(filepath.Join(dir, file), strconv.FormatUint(val, 10)); err != nil {
		return fmt.Errorf("set box cpu weight after its start: %w", err)
	}
	return nil
}

// endBoost ends a start's weight on the parent; a failure to lower it is
// logged (the next start's end tries again).
func (d *Driver) endBoost() {
	if err := d.boost.end(); err != nil {
		d.log.Warn("lowering the boxes' cpu weight after a start", "err", err)
	}
}
