//go:build linux

package gvisor

import (
	"fmt"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
)

// How a box reaches the network (runtime.Spec.Network):
//
//   - nil: runsc --network=none, loopback only, in an empty namespace runsc
//     shares between such boxes (runscRoot/null-netns, see Close).
//   - Network.NetNS: runsc --network=sandbox, with the OCI spec's network
//     namespace set to the daemon's namespace for the box. runsc's sandbox
//     process joins it, copies the addresses and routes of its interfaces
//     into gVisor's netstack, removes the addresses from the host's side of
//     them (so the host kernel in the namespace answers nothing any more)
//     and moves packets over an AF_PACKET socket on each interface. What
//     the daemon decides stays on the host: the veth's host end on the
//     bridge, the nftables sets and rules (egress allow/deny, the DNAT to
//     the DNS forwarder and the egress proxy), the port proxy dialling the
//     box's address. A namespace with loopback only (network mode none)
//     gives a box with lo only.
//
// Because runsc reads the namespace's interfaces once, when the box
// starts, a namespace is single-use with it and a veth added later (a
// switch from none to a connected mode) is never seen by the box: the
// driver does not declare runtime.CapNetworkReplug, and the manager refuses
// that switch by capability.

// runscNetwork is runsc's --network for a box with this attachment.
func runscNetwork(n *runtime.Network) string {
	if n.NetNSPath() == "" {
		return "none"
	}
	return "sandbox"
}

// networkNamespace is the OCI spec's network namespace for a box: the
// daemon's namespace to join, or a new one (runsc --network=none puts the
// box in its shared empty one).
func networkNamespace(n *runtime.Network) specs.LinuxNamespace {
	return specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: n.NetNSPath()}
}

// checkNetwork refuses an attachment the driver cannot join: only network
// namespaces, and only a path that is one (a plain file would make runsc
// fail later with a less clear error).
func checkNetwork(n *runtime.Network) error {
	if n == nil {
		return nil
	}
	if n.NetNS == nil {
		return fmt.Errorf("gvisor: network attachment of an unsupported kind (want a network namespace): %w", errdefs.ErrInvalidArgument)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(n.NetNS.Path, &st); err != nil {
		return fmt.Errorf("gvisor: network namespace %s: %w", n.NetNS.Path, err)
	}
	if st.Type != unix.NSFS_MAGIC {
		return fmt.Errorf("gvisor: %s is not a network namespace: %w", n.NetNS.Path, errdefs.ErrInvalidArgument)
	}
	return nil
}
