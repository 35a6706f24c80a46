package ocibox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/sbxdev/sbx/internal/hostmount"
	"github.com/sbxdev/sbx/internal/runtime"
)

// Both OCI-runtime drivers give box id the cgroup /<parent>/<id> in every
// mounted hierarchy (v1, v2 and hybrid hosts alike). These read them.

// CgroupRoots lists the mount points of every cgroup hierarchy (v1 and v2).
func CgroupRoots() []string {
	ms, err := hostmount.Read()
	if err != nil {
		return nil
	}
	var out []string
	seen := map[string]bool{}
	for _, m := range ms {
		if (m.FSType == "cgroup" || m.FSType == "cgroup2") && !seen[m.MountPoint] {
			seen[m.MountPoint] = true
			out = append(out, m.MountPoint)
		}
	}
	return out
}

// CgroupPids lists the pids in box id's cgroups and their descendants, in
// every hierarchy, without duplicates.
func CgroupPids(parent, id string) []int {
	seen := map[int]bool{}
	var out []int
	for _, root := range CgroupRoots() {
		_ = filepath.WalkDir(filepath.Join(root, parent, id), func(p string, e os.DirEntry, err error) error {
			if err != nil || !e.IsDir() {
				return nil
			}
			b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 0 && !seen[pid] {
					seen[pid] = true
					out = append(out, pid)
				}
			}
			return nil
		})
	}
	return out
}

// CgroupLeftovers lists the box cgroups under parent, in every hierarchy,
// whose ids are not in keep, with the processes still in them.
func CgroupLeftovers(parent string, keep map[string]bool) []runtime.Leftover {
	var out []runtime.Leftover
	ids := map[string]bool{}
	for _, root := range CgroupRoots() {
		ents, _ := os.ReadDir(filepath.Join(root, parent))
		for _, e := range ents {
			if e.IsDir() && !keep[e.Name()] {
				ids[e.Name()] = true
				out = append(out, runtime.Leftover{ID: e.Name(), What: "cgroup " + filepath.Join(root, parent, e.Name())})
			}
		}
	}
	for id := range ids {
		for _, pid := range CgroupPids(parent, id) {
			out = append(out, runtime.Leftover{ID: id, What: "process " + strconv.Itoa(pid) + " (" + comm(pid) + ")"})
		}
	}
	return out
}

// MountLeftovers lists the mounts under boxesDir/<id> for ids not in keep.
func MountLeftovers(boxesDir string, keep map[string]bool) []runtime.Leftover {
	mounts, _ := hostmount.Under(boxesDir)
	var out []runtime.Leftover
	for _, m := range mounts {
		rel, err := filepath.Rel(boxesDir, m)
		if err != nil || rel == "." {
			continue
		}
		id, _, _ := strings.Cut(rel, "/")
		if !keep[id] {
			out = append(out, runtime.Leftover{ID: id, What: "mount " + m})
		}
	}
	return out
}

// DirLeftovers lists the entries of dir (box dirs named by id) not in keep.
func DirLeftovers(dir string, keep map[string]bool) []runtime.Leftover {
	ents, _ := os.ReadDir(dir)
	var out []runtime.Leftover
	for _, e := range ents {
		if !keep[e.Name()] {
			out = append(out, runtime.Leftover{ID: e.Name(), What: "dir " + filepath.Join(dir, e.Name())})
		}
	}
	return out
}

func comm(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return strings.TrimSpace(string(b))
}

// CPUParentDir is cgroup parent's directory in the cpu hierarchy (v1) or
// the unified one (v2, when it has the cpu controller); ok is false if
// the host has neither.
func CPUParentDir(parent string) (dir string, v2, ok bool) {
	roots := CgroupRoots()
	for _, root := range roots {
		if _, err := os.Stat(filepath.Join(root, "cpu.shares")); err == nil {
			return filepath.Join(root, parent), false, true
		}
	}
	for _, root := range roots {
		b, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
		if err == nil && slices.Contains(strings.Fields(string(b)), "cpu") {
			return filepath.Join(root, parent), true, true
		}
	}
	return "", false, false
}

// SetBoxesCPUWeight makes the parent cgroup dir in the cpu hierarchy (if
// missing: the runtime would make it with the default weight) and gives it
// shares (v1 cpu.shares; on v2 cpu.weight, shares*100/1024, 100 being a
// nice-0 process's as 1024 is on v1). All boxes under it then weigh that
// much against each process of the host, the daemon's threads among them,
// whatever the boxes do and however many there are. Called before every
// create: the parent goes when the last box does.
func SetBoxesCPUWeight(dir string, v2 bool, shares uint64) error {
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create the boxes' cpu cgroup: %w", err)
	}
	file, val := "cpu.shares", shares
	if v2 {
		file, val = "cpu.weight", max(1, min(10000, shares*100/1024))
		// The cpu controller must be on in the parent's parent to weigh it.
		_ = os.WriteFile(filepath.Join(filepath.Dir(dir), "cgroup.subtree_control"), []byte("+cpu"), 0)
	}
	path := filepath.Join(dir, file)
	if ReadCgroupInt(path) == int64(val) {
		return nil
	}
	if err := os.WriteFile(path, []byte(strconv.FormatUint(val, 10)), 0); err != nil {
		return fmt.Errorf("set the boxes' cpu weight: %w", err)
	}
	return nil
}
