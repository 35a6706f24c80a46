//go:build !linux

package network

import (
	"errors"
	"net"
	"net/netip"
)

func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	return netip.AddrPort{}, errors.New("transparent proxying needs Linux")
}

func mountBundleFS(string, int) error { return nil }

func unmountBundleFS(string) error { return nil }
