package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/ocibox"
)

var _ runtime.Prober = (*Driver)(nil)

// HostPids lists the processes in box h's cgroups (runtime.Prober):
// runsc's sandbox (gVisor's kernel), gofer and systrap stubs. The box's own
// processes live inside the sandbox and have no host pids.
func (d *Driver) HostPids(ctx context.Context, h runtime.Handle) ([]int, error) {
	if err := checkID(h.ID); err != nil {
		return nil, err
	}
	return ocibox.CgroupPids(d.cgParent, h.ID), nil
}

// Leftovers implements runtime.Prober (see Leftovers).
func (d *Driver) Leftovers(ctx context.Context, keep map[string]bool) ([]runtime.Leftover, error) {
	return Leftovers(Config{StateDir: d.stateDir, CgroupParent: d.cgParent}, keep)
}

// Leftovers lists what is left on the host of the boxes, not in keep, of
// the driver cfg configures (the daemon's leak checks call it without
// making a driver): mounts and dirs under the box dirs, runsc's state
// files, cgroups and their processes, and runsc processes naming a box's
// bundle outside any cgroup (runsc killed before it made the cgroup).
func Leftovers(cfg Config, keep map[string]bool) ([]runtime.Leftover, error) {
	state := filepath.Clean(cfg.StateDir)
	parent := cfg.CgroupParent
	if parent == "" {
		parent = defaultCgroupParent
	}
	boxes := filepath.Join(state, "boxes")
	out := ocibox.MountLeftovers(boxes, keep)
	out = append(out, ocibox.DirLeftovers(boxes, keep)...)
	ents, _ := os.ReadDir(filepath.Join(state, "runsc"))
	for _, e := range ents {
		id, _, ok := strings.Cut(e.Name(), "_sandbox:")
		if !ok {
			id, ok = strings.CutPrefix(strings.TrimSuffix(e.Name(), ".sock"), "runsc-")
		}
		if ok && !keep[id] {
			out = append(out, runtime.Leftover{ID: id, What: "runsc state " + filepath.Join(state, "runsc", e.Name())})
		}
	}
	out = append(out, ocibox.CgroupLeftovers(parent, keep)...)
	cmds, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	prefix := boxes + "/"
	for _, c := range cmds {
		b, err := os.ReadFile(c)
		if err != nil || !strings.HasPrefix(string(b), "runsc") {
			continue
		}
		s := string(b)
		i := strings.Index(s, prefix)
		if i < 0 {
			continue
		}
		id, _, _ := strings.Cut(s[i+len(prefix):], "/")
		id, _, _ = strings.Cut(id, "\x00")
		if !keep[id] {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(c)))
			out = append(out, runtime.Leftover{ID: id, What: "runsc process " + strconv.Itoa(pid)})
		}
	}
	return out, nil
}
