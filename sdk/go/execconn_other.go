//go:build !unix

package sbx

import "net"

// quiet cannot look without reading here: trust the connection (the pool
// keeps it for less time than the daemon does).
func quiet(net.Conn) bool { return true }
