//go:build linux

package oci

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sbxdev/sbx/internal/hostmount"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/ocibox"
)

// cgroupLayout says where the host's cgroup hierarchies are mounted. The OCI
// runtime creates and configures the box cgroups; the driver only reads
// statistics, thaws and removes them, for v1, v2 and hybrid hosts alike.
type cgroupLayout struct {
	// unified is the cgroup2 mount ("" if none). On a pure v2 host it is
	// /sys/fs/cgroup and v1 is empty.
	unified string
	// v1 maps a v1 controller (or "name=systemd") to its mount point.
	v1 map[string]string
	// all lists every hierarchy's mount point, v1 and v2.
	all []string
	// parent is the cgroup, in every hierarchy, under which boxes live.
	parent string
}

func detectCgroups(parent string) (cgroupLayout, error) {
	mounts, err := hostmount.Read()
	if err != nil {
		return cgroupLayout{}, err
	}
	l := cgroupLayout{v1: map[string]string{}, parent: parent}
	for _, m := range mounts {
		switch m.FSType {
		case "cgroup2":
			if l.unified == "" {
				l.unified = m.MountPoint
				l.all = append(l.all, m.MountPoint)
			}
		case "cgroup":
			added := false
			for _, opt := range strings.Split(m.SuperOpts, ",") {
				switch opt {
				case "rw", "ro", "":
					continue
				}
				if _, dup := l.v1[opt]; !dup {
					l.v1[opt] = m.MountPoint
					added = true
				}
			}
			if added {
				l.all = append(l.all, m.MountPoint)
			}
		}
	}
	if l.unified == "" && len(l.v1) == 0 {
		return l, errors.New("no cgroup hierarchy mounted")
	}
	return l, nil
}

// swapAccounting reports whether memory+swap can be limited: always assumed
// on v2 (memory.swap.max), on v1 only with memory.memsw.* files.
func (l cgroupLayout) swapAccounting() bool {
	mp, ok := l.v1["memory"]
	if !ok {
		return l.unified != ""
	}
	_, err := os.Stat(filepath.Join(mp, "memory.memsw.limit_in_bytes"))
	return err == nil
}

// hybrid reports v1 controllers plus a cgroup2 mount (what crun refuses).
func (l cgroupLayout) hybrid() bool { return len(l.v1) > 0 && l.unified != "" }

// dirs lists box id's cgroup directory in every hierarchy.
func (l cgroupLayout) dirs(id string) []string {
	out := make([]string, 0, len(l.all))
	for _, mp := range l.all {
		out = append(out, filepath.Join(mp, l.parent, id))
	}
	return out
}

// ids lists the box ids that have a cgroup in any hierarchy.
func (l cgroupLayout) ids() map[string]bool {
	ids := map[string]bool{}
	for _, mp := range l.all {
		ents, _ := os.ReadDir(filepath.Join(mp, l.parent))
		for _, e := range ents {
			if e.IsDir() {
				ids[e.Name()] = true
			}
		}
	}
	return ids
}

// controllerDir is the box's directory for a v1 controller, or its v2 dir.
func (l cgroupLayout) controllerDir(ctrl, id string) (dir string, v2 bool) {
	if mp, ok := l.v1[ctrl]; ok {
		return filepath.Join(mp, l.parent, id), false
	}
	return filepath.Join(l.unified, l.parent, id), true
}

// thaw unfreezes the box (a frozen task does not die of SIGKILL until thawed).
func (l cgroupLayout) thaw(id string) {
	dir, v2 := l.controllerDir("freezer", id)
	if v2 {
		_ = os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte("0"), 0)
		return
	}
	_ = os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0)
}

// frozen reports whether the box's freezer says it is frozen (or freezing).
func (l cgroupLayout) frozen(id string) bool {
	dir, v2 := l.controllerDir("freezer", id)
	if v2 {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.freeze"))
		return err == nil && strings.TrimSpace(string(b)) == "1"
	}
	b, err := os.ReadFile(filepath.Join(dir, "freezer.state"))
	return err == nil && strings.TrimSpace(string(b)) != "THAWED"
}

// remove kills whatever is still in the box's cgroups and removes them.
func (l cgroupLayout) remove(id string) error {
	var errs []error
	for _, dir := range l.dirs(id) {
		if err := removeCgroupDir(dir); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		l.thaw(id)
	}
	return errors.Join(errs...)
}

// removeCgroupDir rmdirs dir, killing leftover processes and retrying while
// they exit. A missing dir is fine.
func removeCgroupDir(dir string) error {
	delay := 100 * time.Microsecond
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := syscall.Rmdir(dir)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		// Nested cgroups (made inside the box's cgroup namespace) first.
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if e.IsDir() {
				_ = removeCgroupDir(filepath.Join(dir, e.Name()))
			}
		}
		for _, pid := range readPids(filepath.Join(dir, "cgroup.procs")) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0)
		_ = os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte("0"), 0)
		time.Sleep(delay)
		if delay < 10*time.Millisecond {
			delay *= 2
		}
	}
}

func readPids(path string) []int {
	b, _ := os.ReadFile(path)
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			pids = append(pids, n)
		}
	}
	return pids
}

// stats fills the cgroup-derived fields of runtime.Stats.
func (l cgroupLayout) stats(id string) (runtime.Stats, error) {
	var st runtime.Stats
	mem, v2 := l.controllerDir("memory", id)
	if _, err := os.Stat(mem); err != nil {
		return st, fmt.Errorf("box cgroup: %w", err)
	}
	if v2 {
		st.MemoryBytes = ocibox.ReadCgroupInt(filepath.Join(mem, "memory.current"))
		st.MemoryPeakBytes = ocibox.ReadCgroupInt(filepath.Join(mem, "memory.peak"))
		st.OOMKills = ocibox.ReadCgroupKey(filepath.Join(mem, "memory.events"), "oom_kill")
		st.CPUUsageNs = ocibox.ReadCgroupKey(filepath.Join(mem, "cpu.stat"), "usage_usec") * 1000
		st.Pids = ocibox.ReadCgroupInt(filepath.Join(mem, "pids.current"))
		st.PidsLimitHits = ocibox.ReadCgroupKey(filepath.Join(mem, "pids.events"), "max")
		return st, nil
	}
	st.MemoryBytes = ocibox.ReadCgroupInt(filepath.Join(mem, "memory.usage_in_bytes"))
	st.MemoryPeakBytes = ocibox.ReadCgroupInt(filepath.Join(mem, "memory.max_usage_in_bytes"))
	// v1 counts OOM kills per cgroup, not up the tree: the user cgroup's
	// are the box's too.
	st.OOMKills = ocibox.ReadCgroupKey(filepath.Join(mem, "memory.oom_control"), "oom_kill") +
		ocibox.ReadCgroupKey(filepath.Join(mem, userCgroup, "memory.oom_control"), "oom_kill")
	if dir, _ := l.controllerDir("cpuacct", id); dir != "" {
		st.CPUUsageNs = ocibox.ReadCgroupInt(filepath.Join(dir, "cpuacct.usage"))
	}
	if dir, _ := l.controllerDir("pids", id); dir != "" {
		st.Pids = ocibox.ReadCgroupInt(filepath.Join(dir, "pids.current"))
		// As for OOM kills: v1 counts a fork refused at the user cgroup's
		// limit there only (user code's forks hit that one first).
		st.PidsLimitHits = ocibox.ReadCgroupKey(filepath.Join(dir, "pids.events"), "max") +
			ocibox.ReadCgroupKey(filepath.Join(dir, userCgroup, "pids.events"), "max")
	}
	return st, nil
}

// limitEvents reads the box's counts of OOM kills and refused forks. On v1
// both are counted per cgroup (a refused fork in the cgroup that forked,
// so the user cgroup's are the box's too); v2's memory.events and
// pids.events count the whole subtree.
func (l cgroupLayout) limitEvents(id string) (runtime.LimitEvents, error) {
	var ev runtime.LimitEvents
	mem, v2 := l.controllerDir("memory", id)
	if _, err := os.Stat(mem); err != nil {
		return ev, fmt.Errorf("box cgroup: %w", err)
	}
	if v2 {
		ev.OOMKills = ocibox.ReadCgroupKey(filepath.Join(mem, "memory.events"), "oom_kill")
		ev.PidsLimitHits = ocibox.ReadCgroupKey(filepath.Join(mem, "pids.events"), "max")
		return ev, nil
	}
	ev.OOMKills = ocibox.ReadCgroupKey(filepath.Join(mem, "memory.oom_control"), "oom_kill") +
		ocibox.ReadCgroupKey(filepath.Join(mem, userCgroup, "memory.oom_control"), "oom_kill")
	if dir, _ := l.controllerDir("pids", id); dir != "" {
		ev.PidsLimitHits = ocibox.ReadCgroupKey(filepath.Join(dir, "pids.events"), "max") +
			ocibox.ReadCgroupKey(filepath.Join(dir, userCgroup, "pids.events"), "max")
	}
	return ev, nil
}

// boxesCPUWeight gives the parent cgroup in the cpu hierarchy shares
// (ocibox.SetBoxesCPUWeight). Called before every create.
func (l cgroupLayout) boxesCPUWeight(shares uint64) error {
	dir, v2 := l.controllerDir("cpu", "")
	return ocibox.SetBoxesCPUWeight(dir, v2, shares)
}

// removeParent removes the parent cgroup from every hierarchy where it is
// empty; a parent that still holds boxes stays (they outlive the daemon).
func (l cgroupLayout) removeParent() {
	for _, p := range l.dirs("") {
		_ = os.Remove(p) // rmdir of a cgroup; EBUSY while boxes remain
	}
}
