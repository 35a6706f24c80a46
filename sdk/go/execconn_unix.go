//go:build unix

package sbx

import (
	"crypto/tls"
	"net"
	"syscall"
)

// quiet reports whether an idle upgraded connection is still open and has
// nothing to read: a daemon that closed it (idle, restarted) left an EOF,
// and bytes between commands mean it is not in a state to reuse.
func quiet(nc net.Conn) bool {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	ok = false
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		ok = err == syscall.EAGAIN || err == syscall.EWOULDBLOCK
		return true
	})
	return err == nil && ok
}
