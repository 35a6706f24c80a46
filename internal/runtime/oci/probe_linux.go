package oci

import (
	"context"
	"path/filepath"

	"github.com/sbxdev/sbx/internal/idmap"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/ocibox"
)

var _ runtime.Prober = (*Driver)(nil)

// HostPids lists the processes in box h's cgroups (runtime.Prober): the
// agent and everything it started.
func (d *Driver) HostPids(ctx context.Context, h runtime.Handle) ([]int, error) {
	if err := checkID(h.ID); err != nil {
		return nil, err
	}
	return ocibox.CgroupPids(d.cg.parent, h.ID), nil
}

// Leftovers implements runtime.Prober (see Leftovers).
func (d *Driver) Leftovers(ctx context.Context, keep map[string]bool) ([]runtime.Leftover, error) {
	return leftovers(d.stateDir, d.cg.parent, d.ids, keep), nil
}

// Leftovers lists what is left on the host of the boxes, not in keep, of
// the driver cfg configures (the daemon's leak checks call it without
// making a driver): mounts and dirs under the box dirs, the OCI runtime's
// state, cgroups and their processes, id ranges.
func Leftovers(cfg Config, keep map[string]bool) ([]runtime.Leftover, error) {
	pool := cfg.IDPool
	if pool == (idmap.Pool{}) {
		pool = idmap.DefaultPool
	}
	ids, err := idmap.NewAllocator(cfg.IDMapDir, pool)
	if err != nil {
		return nil, err
	}
	parent := cfg.CgroupParent
	if parent == "" {
		parent = defaultCgroupParent
	}
	return leftovers(filepath.Clean(cfg.StateDir), parent, ids, keep), nil
}

func leftovers(stateDir, cgParent string, ids *idmap.Allocator, keep map[string]bool) []runtime.Leftover {
	boxes := filepath.Join(stateDir, "boxes")
	out := ocibox.MountLeftovers(boxes, keep)
	out = append(out, ocibox.DirLeftovers(boxes, keep)...)
	states, _ := filepath.Glob(filepath.Join(stateDir, "runtime", "*"))
	for _, s := range states {
		for _, l := range ocibox.DirLeftovers(s, keep) {
			l.What = "runtime state " + l.What
			out = append(out, l)
		}
	}
	out = append(out, ocibox.CgroupLeftovers(cgParent, keep)...)
	if held, err := ids.Held(boxes); err == nil {
		for owner, r := range held {
			if rel, err := filepath.Rel(boxes, owner); err == nil && !keep[rel] {
				out = append(out, runtime.Leftover{ID: rel, What: "id range " + r.String()})
			}
		}
	}
	return out
}
