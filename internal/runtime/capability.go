package runtime

import (
	"fmt"
	"slices"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// Capability is an optional feature of a driver, or a property callers must
// respect. Drivers declare theirs in Info.Capabilities; the sandbox manager
// checks them (Require) before it calls a driver for something only some
// drivers can do, so a request a driver cannot serve is refused before
// anything is made for it, with an error naming the runtime and what it
// lacks. The conformance suite skips what a driver does not declare.
type Capability string

const (
	// CapPause: Pause and Resume work (stop/start, idle stop, the freeze
	// around codebase sync).
	CapPause Capability = "pause"
	// CapStats: Stats reports memory, CPU and pids.
	CapStats Capability = "stats"
	// CapDiskLimit: Resources.DiskBytes bounds the box's writable layer and
	// Stats reports its use.
	CapDiskLimit Capability = "disk-limit"
	// CapRecover: Recover re-attaches running and paused boxes after a
	// daemon restart.
	CapRecover Capability = "recover"
	// CapUpdate: the driver implements Updater (limits of a running box
	// change; the warm pool hands boxes over with other limits).
	CapUpdate Capability = "update"
	// CapSnapshot: the driver implements Snapshotter (snapshots, diffs,
	// builds' steps).
	CapSnapshot Capability = "snapshot"
	// CapPathPolicies: the box has a /dev/fuse of its own, so the agent can
	// mount path-policy guards.
	CapPathPolicies Capability = "path-policies"
	// CapVolumes: Mount.Volume (named volumes).
	CapVolumes Capability = "volumes"
	// CapCodebases: Mount.Codebase (codebase mounts, whose changes the
	// host reads back from the overlay's upper dir).
	CapCodebases Capability = "codebases"
	// CapHostImage: Image.Host (the built-in host image, alone or under
	// layers snapshotted from a host-image box: the host's read-only /usr).
	CapHostImage Capability = "host-image"
	// CapNetwork: the box joins the network namespace in Spec.Network
	// (Network.NetNS: public, allow-listed and egress-proxied modes,
	// ports). Without it a box has loopback only.
	CapNetwork Capability = "network"
	// CapPodNetwork: the driver enforces Spec.Network.Pod itself, in the
	// box's own network (kubernetes: nftables in the pod, written by an
	// init container): modes public and allow with CIDRs, no
	// allow_domains, domain secrets or scoped tokens (they need the
	// daemon's DNS forwarder, egress proxy and box API), and no policy
	// change of a created box (UpdateNetwork needs CapNetwork).
	CapPodNetwork Capability = "pod-network"
	// CapNetworkReplug: a running (or paused) box picks up an interface
	// added to or removed from its network namespace, so its network mode
	// can switch between none and a connected mode in place (and a warm
	// box, started connected, can be handed to a create asking for none).
	// gvisor lacks it: runsc copies the namespace's interfaces into
	// gVisor's netstack once, when the box starts.
	CapNetworkReplug Capability = "network-replug"
	// CapProcessLimits: Resources.Pids bounds the box's processes and a
	// process that exhausts the box's memory or pids is what fails or is
	// OOM-killed, never the box: the agent keeps serving (attack class 5).
	// Without it the limits still bound the box as a whole on the host, but
	// hitting one may end the whole box (gvisor: gVisor's kernel and every
	// process in it share one host cgroup).
	CapProcessLimits Capability = "process-limits"
	// CapDiskInMemory says a box's writable layer (its disk limit) is held
	// in memory charged to the box's own memory limit (a tmpfs): the manager
	// keeps the disk below the memory limit, or filling the disk would
	// OOM-kill the agent.
	CapDiskInMemory Capability = "disk-in-memory"
)

// Has reports whether the driver declared c.
func (i Info) Has(c Capability) bool { return slices.Contains(i.Capabilities, c) }

// Require returns nil if the driver declared c, else an error wrapping
// errdefs.ErrFailedPrecondition naming the runtime, the capability and what
// needed it ("to stop a sandbox").
func (i Info) Require(c Capability, what string) error {
	if i.Has(c) {
		return nil
	}
	return fmt.Errorf("runtime %q does not support %s (it lacks the %q capability): %w", i.Name, what, c, errdefs.ErrFailedPrecondition)
}

// CapabilityNames returns cs as strings (for the API).
func CapabilityNames(cs []Capability) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = string(c)
	}
	return out
}
