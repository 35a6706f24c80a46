package runtime

import "context"

// Prober lets tests and operators look at a driver's boxes from the host
// without knowing the driver's layout: the conformance suite's isolation
// and leak checks, and the integration tests' leak checker (through
// internal/daemon, which knows each driver's configuration), use it. Every
// driver implements it; the suite fails a driver that does not.
type Prober interface {
	// HostPids lists the host pids of the processes box h is made of: its
	// own processes under a shared-kernel driver (oci), gVisor's sentry,
	// gofer and systrap stubs under gvisor. The suite checks each is
	// confined (not host root, in a user namespace of its own, seccomp).
	HostPids(ctx context.Context, h Handle) ([]int, error)
	// Leftovers lists what is left on the host of this driver's boxes
	// whose ids are not in keep: mounts, dirs, state files, cgroups,
	// processes, id ranges. It only reads. A box destroyed, or cleaned up
	// after a crash, has none.
	Leftovers(ctx context.Context, keep map[string]bool) ([]Leftover, error)
}

// Leftover is one host resource of a box that should be gone.
type Leftover struct {
	// ID is the box's id ("" if the resource names none).
	ID string
	// What names the resource for humans: "cgroup /sys/fs/cgroup/pids/p/x",
	// "process 1234 (runsc-gofer)", "dir /var/lib/sbx/oci/boxes/x".
	What string
}

func (l Leftover) String() string { return l.What + " of box " + l.ID }
