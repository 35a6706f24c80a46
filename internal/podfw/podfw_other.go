//go:build !linux

package podfw

import "errors"

// Apply needs Linux (nftables, or the x_tables setsockopts).
func Apply(Rules) error { return errors.New("the pod firewall needs linux") }
