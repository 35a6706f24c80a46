// Package podfw is the firewall a kubernetes pod's init container
// programs in the pod's network namespace before user code starts
// (`sbx-agent sbx-firewall BACKEND MODE PORT...`): the way sbx's network
// modes hold on clusters whose CNI does not enforce NetworkPolicy. Two
// backends: nftables (runc pods: one table in the pod's netns) and
// iptables (gVisor pods: runsc's netstack has no nftables but takes the
// legacy x_tables setsockopts, iptables.go). The init container holds
// NET_ADMIN (and, for iptables, NET_RAW); the box container holds neither,
// so box root can neither change nor flush the rules (EPERM). See
// docs/DRIVERS.md.
package podfw

import (
	"fmt"
	"strconv"
)

// Arg is argv[1] of the agent binary run as the firewall init container.
const Arg = "sbx-firewall"

// The backends: how the rules are programmed.
const (
	// BackendNFTables writes an nftables table (runc and other runtimes
	// sharing the node's kernel).
	BackendNFTables = "nftables"
	// BackendIPTables replaces the IPv4 and IPv6 iptables filter tables
	// (gVisor, whose netstack implements these and not nftables).
	BackendIPTables = "iptables"
)

// Table is the nftables table (family inet) the firewall owns.
const Table = "sbx_pod"

// ModeNone is the only mode so far: loopback, and the agent's ports
// inbound (with their replies), nothing else in or out.
const ModeNone = "none"

// Rules is what the firewall enforces.
type Rules struct {
	Backend string
	Mode    string
	// AgentPorts take TCP connections from anywhere (the daemon's
	// address is not known to the pod); the agent authenticates them.
	AgentPorts []uint16
}

// Parse reads `BACKEND MODE PORT...` (argv after Arg).
func Parse(args []string) (Rules, error) {
	if len(args) < 2 {
		return Rules{}, fmt.Errorf("usage: sbx-agent %s %s|%s MODE [AGENT-PORT...]", Arg, BackendNFTables, BackendIPTables)
	}
	r := Rules{Backend: args[0], Mode: args[1]}
	if r.Backend != BackendNFTables && r.Backend != BackendIPTables {
		return Rules{}, fmt.Errorf("firewall backend %q: want %q or %q", r.Backend, BackendNFTables, BackendIPTables)
	}
	if r.Mode != ModeNone {
		return Rules{}, fmt.Errorf("firewall mode %q: want %q", r.Mode, ModeNone)
	}
	for _, a := range args[2:] {
		p, err := strconv.ParseUint(a, 10, 16)
		if err != nil || p == 0 {
			return Rules{}, fmt.Errorf("agent port %q: want 1-65535", a)
		}
		r.AgentPorts = append(r.AgentPorts, uint16(p))
	}
	return r, nil
}
