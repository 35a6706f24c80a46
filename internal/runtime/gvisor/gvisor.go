// Package gvisor is the runtime.Driver that runs each box under gVisor's
// runsc: the box's processes talk to gVisor's user-space kernel (the
// sentry), not to the host's, which is the stronger of sbx's two isolation
// tiers. Only internal/daemon imports it.
//
// How a box is made:
//   - rootfs: an overlay of the image's layers (or the host image's
//     skeleton, internal/hostimage) under a writable layer on a tmpfs sized
//     by the disk limit, mounted on the host by the driver; runsc runs with
//     --overlay2=none so the box's writes land there (bounded, and readable
//     by the host like the oci driver's), /tmp included (tmp_linux.go). The
//     host image's /usr, volumes and codebase overlays are OCI bind mounts
//     served by runsc's gofer.
//   - ids: runsc puts the sandbox and the gofer in a user namespace mapping
//     box uid 0 to idmap.Canonical, the range stored trees (layers,
//     volumes, codebases) are kept in, so files show their owners inside.
//   - the agent endpoint: runsc cannot take over a listening host socket, so
//     the agent listens itself on Unix sockets in /.sbx/run, a bind mount of
//     the box dir's run/; with --host-uds=create runsc's gofer binds the
//     socket files on the host, where the daemon dials them. The ready pipe
//     is handed over with --pass-fd (a pipe is an ordinary host fd to
//     gVisor), so Create still returns only once the agent serves.
//   - networking: with Config.Network, the box joins the daemon's network
//     namespace for it and runsc's --network=sandbox runs gVisor's
//     netstack over the veth there (network_linux.go); the host's side
//     (bridge, firewall, DNS, egress proxy) is the daemon's as under oci.
//     Without an attachment: runsc --network=none, loopback only.
//
// Limits are runsc's cgroup (memory, CPU, pids plus runsc's own threads),
// which Update rewrites (update_linux.go); Diff writes the writable layer
// like the oci driver (snapshot_linux.go); the agent installs the seccomp
// profile (seccomp_linux.go). Stats come from `runsc events --stats`. State lives in runsc's --root
// under the state dir and in one dir per box; the Handle carries nothing
// the driver cannot find again from the box id.
package gvisor

import (
	"log/slog"

	"github.com/sbxdev/sbx/internal/runtime"
)

// Config configures a Driver.
type Config struct {
	// StateDir holds runsc's state, the box dirs and the host image.
	// Absolute, and short: box sockets live under it (108-byte limit).
	StateDir string
	// RunscPath is the runsc binary ("" = "runsc" on PATH).
	RunscPath string
	// AgentPath is the sbx-agent binary (static).
	AgentPath string
	// CgroupParent names the cgroup under which boxes' cgroups are made
	// (one per daemon data dir, so daemons never clean up each other's).
	CgroupParent string
	// Network says the caller gives boxes network namespaces
	// (runtime.Spec.Network): the driver then advertises the "network"
	// capability (see network_linux.go). Without it boxes have loopback
	// only.
	Network bool
	// Platform is runsc's platform ("" = systrap; kvm hangs on nested PVM).
	Platform string
	// BoxesCPUShares is the CPU weight of all gvisor boxes together (the
	// parent cgroup's cpu.shares, cpu.weight shares*100/1024 on v2)
	// against each host process, the daemon's threads included, as the oci
	// driver's boxes have theirs: 0 = ocibox.DefaultBoxesCPUShares.
	BoxesCPUShares uint64
	Logger         *slog.Logger
}

// name is the driver's runtime name.
const name = "gvisor"

// defaultCgroupParent is Config.CgroupParent's default.
const defaultCgroupParent = "sbx-gvisor"

// capabilities are what every gvisor box offers (plus network with
// Config.Network). Not (yet): network-replug (runsc reads the namespace's
// interfaces once, at start), path-policies (the agent's FUSE guards need a /dev/fuse
// the driver does not give), process-limits (gVisor's kernel and every
// process in the box share one host cgroup: a process that exhausts the
// box's memory gets the whole sandbox OOM-killed, and the box's processes
// are tasks of gVisor's kernel, not host processes, so the host's pids
// limit bounds runsc's threads, not a fork bomb inside, which grows until
// the memory limit ends the sandbox).
var capabilities = []runtime.Capability{
	runtime.CapPause, runtime.CapStats, runtime.CapDiskLimit, runtime.CapRecover,
	runtime.CapVolumes, runtime.CapCodebases, runtime.CapHostImage, runtime.CapDiskInMemory,
	runtime.CapUpdate, runtime.CapSnapshot,
}
