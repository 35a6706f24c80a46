package oci

import (
	"strconv"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sbxdev/sbx/internal/idmap"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/ocibox"
)

// agentInBox is where the agent binary is bind-mounted inside every box.
const agentInBox = ocibox.AgentInBox

// boxCapabilities is Docker's default capability set (ocibox.Capabilities)
// plus CAP_SYS_ADMIN, which only the agent ever holds: it mounts the FUSE
// permission layers of path policies with it, then drops it from every set
// of every thread before it starts any process (see
// internal/agent/guards_linux.go), so user code never has it. They are
// capabilities in the box's user namespace.
var boxCapabilities = append(append([]string(nil), ocibox.Capabilities...), "CAP_SYS_ADMIN")

// maskedPaths are hidden in every box (an empty read-only tmpfs over a
// directory, /dev/null over a file; missing ones are skipped). Besides
// Docker's list, what shows the host's or other tenants' details and no box
// needs: the kernel command line and build configuration, the crash
// kernel's notes (physical addresses), the host's swap files, and every
// virtual block device — loop devices carry other tenants' volume image
// paths in loop/backing_file and their sizes and I/O counters (the
// /sys/block, /sys/class/block and /sys/dev/block links all lead there),
// as /proc/partitions and /proc/diskstats list them too.
var maskedPaths = []string{
	"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
	"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
	"/sys/firmware", "/sys/devices/virtual/powercap",
	"/proc/cmdline", "/proc/config.gz", "/sys/kernel/vmcoreinfo", "/proc/swaps",
	"/sys/devices/virtual/block", "/proc/partitions", "/proc/diskstats",
}

var readonlyPaths = []string{
	"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
}

// specParams is what varies between boxes' config.json.
type specParams struct {
	ID           string
	CgroupParent string
	Hostname     string
	Command      []string
	Env          []string
	Workdir      string
	Resources    runtime.Resources
	HostImage    bool   // bind the host's /usr read-only
	AgentPath    string // the agent binary, inside the box's rootfs (its agent layer)
	// NoFile is the box's RLIMIT_NOFILE, soft and hard: the agent sets it
	// on itself (--nofile) before any user process exists, and everything
	// in the box inherits it (see the Rlimits note in buildSpec).
	NoFile uint64
	// NetNS is a network namespace to join ("" = a new one): the driver
	// runs the runtime in it and config.json names none.
	NetNS string
	// SysfsSource, if set, is bind-mounted read-only at /sys instead of a
	// new sysfs (which a box cannot mount in a netns it does not own).
	SysfsSource string
	// SwapLimit sets memory+swap to the memory limit; false on v1 hosts
	// without swap accounting, where the runtime would fail to set it.
	SwapLimit bool
	// Mounts are extra bind mounts (volumes, codebases, files).
	Mounts []ocibox.Bind
	// FuseDevice, if set, is the box's own /dev/fuse node (makeFuseDevice),
	// owned by its root and bound at /dev/fuse for the agent's permission
	// layers.
	FuseDevice string
	// AgentSeccomp has the agent install the seccomp profile (--seccomp)
	// instead of the runtime.
	AgentSeccomp bool
	// IDs is the box's host id range and UserNS its user namespace (a
	// bind-mounted nsfs file mapping box ids 0.. to IDs), which the runtime
	// joins. The mappings are repeated in the spec for runtimes that want
	// them with a namespace path (runc 1.1).
	IDs    idmap.Range
	UserNS string
	// UserCgroups is how many user cgroups' `tasks` files (usercgroup.go)
	// the agent inherits, after runtime.AgentFDArgs's fds.
	UserCgroups int
}

// buildSpec returns the hardened OCI runtime spec of a box.
func buildSpec(p specParams) *specs.Spec {
	args := append([]string{agentInBox}, runtime.AgentFDArgs...)
	var filter *specs.LinuxSeccomp
	if p.AgentSeccomp {
		args = append(args, "--seccomp")
	} else {
		filter = ocibox.Seccomp()
	}
	if p.NoFile > 0 {
		args = append(args, "--nofile", strconv.FormatUint(p.NoFile, 10))
	}
	for i := range p.UserCgroups {
		args = append(args, "--user-cgroup-fd", strconv.Itoa(3+runtime.AgentFDCount+i))
	}
	if len(p.Command) > 0 {
		args = append(append(args, "--"), p.Command...)
	}
	s := &specs.Spec{
		Version:  "1.0.2",
		Hostname: p.Hostname,
		Root:     &specs.Root{Path: "rootfs"},
		// No Rlimits: the runtime sets them with prlimit(2) from the host,
		// which a box whose user namespace host root does not own refuses
		// without CAP_SYS_RESOURCE. The agent sets its own RLIMIT_NOFILE
		// instead (--nofile NoFile: lowering one's own limits needs no
		// privilege), before it starts any process. OOMScoreAdj stays
		// unset: lowering it needs CAP_SYS_RESOURCE.
		Process: ocibox.Process(args, p.Env, p.Workdir, boxCapabilities),
		Mounts:  boxMounts(p),
		Linux: &specs.Linux{
			UIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: p.IDs.Base, Size: p.IDs.Size}},
			GIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: p.IDs.Base, Size: p.IDs.Size}},
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.UserNamespace, Path: p.UserNS},
				{Type: specs.CgroupNamespace},
			},
			CgroupsPath:   "/" + p.CgroupParent + "/" + p.ID,
			Resources:     boxResources(p.Resources, p.SwapLimit),
			Seccomp:       filter,
			MaskedPaths:   maskedPaths,
			ReadonlyPaths: readonlyPaths,
		},
	}
	if p.NetNS == "" {
		// A new one; a given one the runtime's process joins (see start).
		s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.NetworkNamespace})
	}
	return s
}

func boxMounts(p specParams) []specs.Mount {
	m := append(ocibox.DevMounts(),
		specs.Mount{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}})
	if p.SysfsSource != "" {
		m = append(m, specs.Mount{Destination: "/sys", Type: "bind", Source: p.SysfsSource, Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}})
	} else {
		m = append(m, specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}})
	}
	if p.HostImage {
		m = append(m, ocibox.HostUsr())
	}
	if p.FuseDevice != "" {
		m = append(m, specs.Mount{Destination: "/dev/fuse", Type: "bind", Source: p.FuseDevice, Options: []string{"bind", "nosuid", "noexec"}})
	}
	m = append(m, ocibox.AgentMount(p.AgentPath))
	return append(m, ocibox.BindMounts(p.Mounts, false)...)
}

func boxResources(r runtime.Resources, swapLimit bool) *specs.LinuxResources {
	res := &specs.LinuxResources{
		Devices: boxDevices(),
	}
	if r.MemoryBytes > 0 {
		mem := r.MemoryBytes
		// memory+swap equal to memory: no escaping the limit through swap.
		res.Memory = &specs.LinuxMemory{Limit: &mem}
		if swapLimit {
			res.Memory.Swap = &mem
		}
	}
	// The box starts at the most weight among boxes; Create sets its own
	// (cpuShares) once the agent is ready (startboost.go).
	shares := uint64(startShares)
	res.CPU = &specs.LinuxCPU{Shares: &shares}
	if r.CPUMillis > 0 {
		period, quota := uint64(cpuPeriod), cpuQuota(r.CPUMillis)
		res.CPU.Period, res.CPU.Quota = &period, &quota
	}
	if r.Pids > 0 {
		pids := r.Pids
		res.Pids = &specs.LinuxPids{Limit: &pids}
	}
	return res
}

// cpuPeriod is the CFS period every box uses (µs); CPUMillis scale the quota.
const cpuPeriod = 100000

// cpuQuota converts CPUMillis to a CFS quota per cpuPeriod (at least 1 ms,
// the kernel's minimum).
func cpuQuota(millis int64) int64 {
	q := millis * cpuPeriod / 1000
	if q < 1000 {
		q = 1000
	}
	return q
}

// cpuShares weighs a box by its CPUs among boxes when they contend: 1024
// (a nice-0 process) per CPU, at least 2 (the kernel's minimum). runc
// converts it to cpu.weight on cgroup v2.
func cpuShares(millis int64) uint64 {
	return uint64(max(2, millis*1024/1000))
}

// boxDevices is a box's device cgroup: every device denied but the
// standard ones the runtime provides (null, zero, full, random, urandom,
// tty, ptmx, the ptys) and /dev/fuse. The runtimes add rules of their own
// to it, which narrowDevices takes back out.
func boxDevices() []specs.LinuxDeviceCgroup {
	return []specs.LinuxDeviceCgroup{
		{Allow: false, Access: "rwm"},
		charDev(1, 3), charDev(1, 5), charDev(1, 7), charDev(1, 8), charDev(1, 9),
		charDev(5, 0), charDev(5, 2), charDev(136, -1), charDev(10, 229),
	}
}

func charDev(major, minor int64) specs.LinuxDeviceCgroup {
	d := specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &major, Access: "rwm"}
	if minor >= 0 {
		d.Minor = &minor
	}
	return d
}

// startShares is a starting box's cpu.shares (cpu.weight 10000 on cgroup
// v2 by runc's conversion): the kernel's most (see startboost.go).
const startShares = 262144
