// Package podfw is the firewall a kubernetes pod's init container
// programs in the pod's network namespace before user code starts
// (`sbx-agent sbx-firewall MODE PORT...`): the way sbx's network modes hold
// on clusters whose CNI does not enforce NetworkPolicy. The init container
// holds NET_ADMIN; the box container never does, so box root can neither
// change nor flush the rules (nfnetlink refuses it with EPERM). See
// docs/DRIVERS.md.
package podfw

import (
	"fmt"
	"strconv"
)

// Arg is argv[1] of the agent binary run as the firewall init container.
const Arg = "sbx-firewall"

// Table is the nftables table (family inet) the firewall owns.
const Table = "sbx_pod"

// ModeNone is the only mode so far: loopback, and the agent's ports
// inbound (with their replies), nothing else in or out.
const ModeNone = "none"

// Rules is what the firewall enforces.
type Rules struct {
	Mode string
	// AgentPorts take TCP connections from anywhere (the daemon's
	// address is not known to the pod); the agent authenticates them.
	AgentPorts []uint16
}

// Parse reads `MODE PORT...` (argv after Arg).
func Parse(args []string) (Rules, error) {
	if len(args) < 1 {
		return Rules{}, fmt.Errorf("usage: sbx-agent %s MODE [AGENT-PORT...]", Arg)
	}
	r := Rules{Mode: args[0]}
	if r.Mode != ModeNone {
		return Rules{}, fmt.Errorf("firewall mode %q: want %q", r.Mode, ModeNone)
	}
	for _, a := range args[1:] {
		p, err := strconv.ParseUint(a, 10, 16)
		if err != nil || p == 0 {
			return Rules{}, fmt.Errorf("agent port %q: want 1-65535", a)
		}
		r.AgentPorts = append(r.AgentPorts, uint16(p))
	}
	return r, nil
}
