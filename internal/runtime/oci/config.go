// Package oci owns OCI-bundle sandboxes run by an OCI runtime binary (runc,
// crun; runsc later). For each box it assembles a root filesystem (overlayfs
// over image layers or the built-in "host" skeleton, with a size-bounded
// tmpfs as the writable layer), writes a hardened config.json (user
// namespace, minimal capabilities, seccomp allowlist, masked /proc paths,
// cgroup limits) and starts the runtime with sbx-agent as the box's init,
// listening on a Unix socket the driver created.
//
// The writable layer is a tmpfs whose size is Resources.DiskBytes. Its pages
// are charged to the memory cgroup of the process that writes them, i.e. the
// box: files written inside a box count against its memory limit too, so the
// memory limit should exceed the disk bound for the disk bound to be reached.
//
// Every box has its own host uid/gid range (internal/idmap: allocated
// host-wide, recorded in the handle and under /run, freed when the box is
// gone) and its own user namespace, created by the driver with the range's
// first uid as owner and joined by the runtime, so per-user kernel counters
// (inotify, RT signals, processes, pipe pages, keys) are charged per box and
// never to host root. Trees are stored in the canonical range 100000..165535
// (image layers shifted by the image store, writable layers, codebases,
// volumes) and each box sees them through idmapped mounts in its own range;
// files owned by ids outside the canonical range (host root's) show up as
// nobody.
//
// Only internal/daemon (and tests) should import it; everything else uses
// the runtime.Driver interface.
//
// Reaping: the box's init is started with `<runtime> run --detach`, so once
// the runtime exits the init is re-parented to the nearest child subreaper.
// On hosts (and containers) whose PID 1 does not reap orphans that would leave
// a zombie per destroyed box, so New makes the calling process a child
// subreaper and Destroy reaps the box's init with a targeted wait4(pid) —
// never wait4(-1), which would steal exit statuses from os/exec. A daemon
// that embeds this driver therefore adopts every orphan of its descendants;
// boxes recovered after a daemon restart are not our children and their init
// is left to whoever adopted it.
package oci

import (
	"log/slog"

	"github.com/sbxdev/sbx/internal/idmap"
	"github.com/sbxdev/sbx/internal/runtime/ocibox"
)

// Config configures a Driver.
type Config struct {
	// StateDir holds everything the driver makes on disk: box dirs, the host
	// image skeleton, the runtime's private --root, the agent layer. It
	// must be on a local filesystem usable as an overlayfs lower dir, short
	// enough for <StateDir>/boxes/<id>/agent.sock to fit a Unix socket
	// address, and every ancestor must be searchable (o+x) by the mapped uid
	// because the runtime resolves bundle paths inside the user namespace.
	StateDir string
	// RuntimePath is the OCI runtime binary; "" picks crun where it works on
	// this host, else runc.
	RuntimePath string
	// AgentPath is the sbx-agent binary (static). It is copied into an
	// image layer of its own under StateDir/agent, the topmost lower layer
	// of every box, and bind-mounted read-only at /.sbx/sbx-agent from the
	// box's overlay (so no host path shows in the box's mountinfo).
	AgentPath string
	// CgroupParent is the cgroup, in every hierarchy, under which boxes live
	// ("" = "sbx"). Cleanup removes every box cgroup under it that it is not
	// told to keep, so drivers over different state dirs on one host (tests
	// next to a daemon) need different parents.
	CgroupParent string
	// Network says the caller gives boxes network namespaces with a veth
	// (runtime.Spec.NetNS): the driver then advertises the "network"
	// capability. Without it boxes have loopback only.
	Network bool
	// SeccompInRuntime has the OCI runtime install the box's seccomp profile
	// (compiling it with libseccomp on every start, 4-10 ms here) rather
	// than the agent (a filter compiled in Go, internal/seccomp, installed
	// before the agent does anything else). Architectures without a syscall
	// table in internal/seccomp always use the runtime.
	SeccompInRuntime bool
	// IDMapDir records which host id ranges boxes hold, host-wide ("" =
	// idmap.DefaultDir, on /run): drivers over different state dirs on one
	// host must share it so that no two boxes get the same range.
	IDMapDir string
	// IDPool is where boxes' id ranges are carved from (zero =
	// idmap.DefaultPool).
	IDPool idmap.Pool
	// BoxLimits bound what all of one box's processes together hold of the
	// kernel's per-user counters (user and other namespaces, inotify and
	// fanotify, queued signals, message queues; see idmap.Limits). nil =
	// idmap.DefaultLimits(); values above the host's are lowered to them.
	BoxLimits idmap.Limits
	// BoxesCPUShares is the CPU weight of all boxes together (the parent
	// cgroup's cpu.shares; cpu.weight shares*100/1024 on cgroup v2)
	// against each process outside them, the daemon's threads included:
	// 0 = DefaultBoxesCPUShares. It costs boxes nothing on an idle host.
	BoxesCPUShares uint64
	// Logger receives driver logs; nil means slog.Default().
	Logger *slog.Logger
}

// DefaultBoxesCPUShares is Config.BoxesCPUShares's default: all boxes
// together weigh as an eighth of one busy host process, so that the
// daemon and the agents' control path (whose requests the daemon serves)
// get the CPU at once when every box is busy.
const DefaultBoxesCPUShares = ocibox.DefaultBoxesCPUShares

// defaultCgroupParent is Config.CgroupParent's default.
const defaultCgroupParent = "sbx"
