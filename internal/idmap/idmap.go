// Package idmap owns per-sandbox host uid/gid ranges: their allocation
// (host-wide, so that boxes of every daemon on a host get distinct ranges),
// user namespaces whose owner is a box's own host uid (so that per-user
// kernel counters - inotify instances and watches, the RT signal queue,
// RLIMIT_NPROC, pipe buffer pages, keys - are charged to that uid, never to
// host root or a neighbour), and idmapped mounts that show trees stored in
// the canonical range (image layers, codebases, volumes, writable layers:
// Canonical) in a box's own range.
//
// It imports nothing from sbx; internal/runtime/oci uses it.
package idmap

import (
	"fmt"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// Canonical is the host range every tree a box can see is stored in: box
// uid u is stored as host uid Canonical.Base+u whatever box wrote it, so
// trees can be shared between boxes and survive them.
var Canonical = Range{Base: 100000, Size: 65536}

// Range is Size host uids (and gids) from Base; box uid 0 maps to Base.
type Range struct {
	Base uint32 `json:"base"`
	Size uint32 `json:"size"`
}

// Contains reports whether host id is in r.
func (r Range) Contains(id uint32) bool { return id >= r.Base && id-r.Base < r.Size }

// Overlaps reports whether r and o share an id.
func (r Range) Overlaps(o Range) bool {
	return uint64(r.Base) < uint64(o.Base)+uint64(o.Size) && uint64(o.Base) < uint64(r.Base)+uint64(r.Size)
}

func (r Range) String() string { return fmt.Sprintf("%d-%d", r.Base, uint64(r.Base)+uint64(r.Size)-1) }

// Pool is where per-box ranges are carved from: Slots ranges of Size ids
// from First. The default sits far above the ranges distributions hand to
// users in /etc/subuid (100000 + 65536*n) and below the overflow ids.
type Pool struct {
	First uint32
	Size  uint32
	Slots uint32
}

// DefaultPool: 16384 ranges of 65536 ids from 2^28 (268435456), up to
// 2^30-1.
var DefaultPool = Pool{First: 1 << 28, Size: 65536, Slots: 16384}

// slot returns the range of slot i.
func (p Pool) slot(i uint32) Range { return Range{Base: p.First + i*p.Size, Size: p.Size} }

// index is the slot of r, or an error if r is not one of p's slots.
func (p Pool) index(r Range) (uint32, error) {
	if r.Size != p.Size || r.Base < p.First || (r.Base-p.First)%p.Size != 0 || (r.Base-p.First)/p.Size >= p.Slots {
		return 0, fmt.Errorf("id range %v is not a slot of the pool (%d ranges of %d from %d): %w",
			r, p.Slots, p.Size, p.First, errdefs.ErrInvalidArgument)
	}
	return (r.Base - p.First) / p.Size, nil
}

// check validates p: slots of at least 65536 ids, not overlapping
// Canonical, within the 32-bit id space (below the overflow id 2^32-1).
func (p Pool) check() error {
	end := uint64(p.First) + uint64(p.Size)*uint64(p.Slots)
	switch {
	case p.Size < 65536 || p.Slots == 0:
		return fmt.Errorf("id pool: %d ranges of %d ids: want at least one range of 65536: %w", p.Slots, p.Size, errdefs.ErrInvalidArgument)
	case end >= 1<<32-1:
		return fmt.Errorf("id pool: ends at %d, past the 32-bit id space: %w", end, errdefs.ErrInvalidArgument)
	case (Range{Base: p.First, Size: uint32(end - uint64(p.First))}).Overlaps(Canonical):
		return fmt.Errorf("id pool from %d overlaps the canonical range %v: %w", p.First, Canonical, errdefs.ErrInvalidArgument)
	}
	return nil
}
