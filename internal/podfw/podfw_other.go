//go:build !linux

package podfw

import "errors"

// Apply needs Linux's nftables.
func Apply(Rules) error { return errors.New("the pod firewall needs linux nftables") }
