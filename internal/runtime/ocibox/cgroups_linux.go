package ocibox

import (
	"os"
	"path/filepath"
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
