package oci

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
)

// The host's file table (fs.file-max) is one counter of open struct files
// for the whole kernel: namespaces and cgroups do not split it, and only
// CAP_SYS_ADMIN in the initial user namespace may go past it. A default box
// (512 pids, RLIMIT_NOFILE 20,000 to 1,048,576) could hold millions of
// files, so two boxes opening /dev/null in a loop took all of a stock
// fs.file-max (2.4 M on a 24 GiB host) and left neighbours, non-root host
// processes and OCI runtimes starting new boxes with ENFILE.
//
// Every struct file is allocated from the "filp" slab cache, which is
// SLAB_ACCOUNT (Linux 4.5 and later): it is charged to the memory cgroup of
// the task that opens it, on cgroup v1 (into memory.usage_in_bytes, via
// memory.kmem.*) as on v2, unless the kernel was booted with
// cgroup.memory=nokmem. Measured on the 6.18 development host (cgroup v1):
// 95,000 opens of /dev/null added 20.3 MiB to memory.kmem.usage_in_bytes
// and 24.5 MiB to memory.usage_in_bytes (≈ 260 bytes a file with its fd
// table slot), and a 64 MiB cgroup opening 285,000 files was OOM-killed at
// its limit. So each file costs its box memory, which the box's memory limit
// bounds; the global counter is then only a way for one tenant to starve the
// others. prepareFileTable therefore raises fs.file-max to LONG_MAX, as
// systemd does at boot since v240, and the memory limit is what bounds a
// box's files. fs.nr_open (the most RLIMIT_NOFILE may be) is left alone:
// it bounds one process, not the host.
//
// Where that cannot be done (nokmem, or /proc/sys read-only in a container)
// the file table stays shared and each box gets an RLIMIT_NOFILE small
// enough that all its processes together hold at most 1/fileShare of
// fs.file-max (boxNoFile), and the driver's health detail says so.

// fileShare: without memory-bounded files, one box's processes may hold at
// most 1/fileShare of fs.file-max between them.
const fileShare = 8

// minBoxNoFile is the least RLIMIT_NOFILE a box gets (the usual soft limit
// programs expect).
const minBoxNoFile = 1024

// fileTable is what prepareFileTable found.
type fileTable struct {
	// bounded: struct files are charged to boxes' memory cgroups and
	// fs.file-max is out of reach.
	bounded bool
	// max is fs.file-max (when not bounded).
	max int64
	// reason says why not bounded.
	reason string
}

const fileMaxPath = "/proc/sys/fs/file-max"

// prepareFileTable raises fs.file-max to LONG_MAX when struct files are
// charged to memory cgroups (see above).
func prepareFileTable(log *slog.Logger) fileTable {
	cur, err := readSysctlInt(fileMaxPath)
	if err != nil {
		return fileTable{reason: err.Error()}
	}
	cmdline, _ := os.ReadFile("/proc/cmdline")
	if !kmemAccounted(string(cmdline)) {
		return fileTable{max: cur, reason: "booted with cgroup.memory=nokmem: open files are not charged to boxes' memory"}
	}
	if cur < math.MaxInt64 {
		if err := os.WriteFile(fileMaxPath, []byte(strconv.FormatInt(math.MaxInt64, 10)), 0); err != nil {
			return fileTable{max: cur, reason: fmt.Sprintf("cannot raise fs.file-max: %v", err)}
		}
		log.Info("raised fs.file-max: open files are charged to each box's memory limit instead",
			"from", cur, "to", int64(math.MaxInt64))
	}
	return fileTable{bounded: true}
}

// kmemAccounted reports whether the kernel charges kernel memory (struct
// file among it) to memory cgroups, given its command line.
func kmemAccounted(cmdline string) bool {
	for _, f := range strings.Fields(cmdline) {
		if f == "--" {
			break // what follows goes to init
		}
		if v, ok := strings.CutPrefix(f, "cgroup.memory="); ok {
			for _, o := range strings.Split(v, ",") {
				if o == "nokmem" {
					return false
				}
			}
		}
	}
	return true
}

func readSysctlInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", path, err)
	}
	return n, nil
}

// boxNoFile is the RLIMIT_NOFILE of a box with the given pids limit: the
// driver's own (what the daemon's hard limit allows, at most 2^20) when
// files are memory-bounded; otherwise small enough that pids processes
// hold at most 1/fileShare of fs.file-max together (never below
// minBoxNoFile: a box with a huge pids limit may then hold pids×1024).
func (d *Driver) boxNoFile(pids int64) uint64 {
	return boxNoFile(d.files, d.noFile, pids)
}

func boxNoFile(ft fileTable, cap uint64, pids int64) uint64 {
	if ft.bounded {
		return cap
	}
	if pids <= 0 {
		pids = 1 << 22 // unlimited: the kernel's most
	}
	n := uint64(ft.max / fileShare / pids)
	return min(max(n, minBoxNoFile), cap)
}
