package network

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// originalDst returns where a connection redirected by nftables was going
// (conntrack's original destination, SO_ORIGINAL_DST).
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var serr error
	err = rc.Control(func(fd uintptr) {
		// A sockaddr_in fits the 16 bytes of an ipv6_mreq: family, port
		// (big endian), address.
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		b := m.Multiaddr
		ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), binary.BigEndian.Uint16(b[2:4]))
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	return ap, nil
}

// bundleFSName is the source the bundle's tmpfs shows in mountinfo.
const bundleFSName = "sbx-ca"

// mountBundleFS mounts a tmpfs at dir unless one of ours is there already
// (a daemon that crashed left it; boxes may still hold binds of it), sized
// for two copies of a bundle of size bytes (the atomic rewrite). No noexec:
// a flag of the source is locked for a box's user namespace, and the
// runtime's read-only remount of the bind (nosuid, nodev) must keep it.
func mountBundleFS(dir string, size int) error {
	if ours, err := isBundleFS(dir); err != nil || ours {
		return err
	}
	opts := fmt.Sprintf("mode=0755,size=%d,nr_inodes=16", 2*size+64<<10)
	if err := unix.Mount(bundleFSName, dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount CA bundle tmpfs at %s: %w", dir, err)
	}
	return nil
}

// isBundleFS reports whether dir is the root of a tmpfs (the bundle's).
func isBundleFS(dir string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return false, fmt.Errorf("stat %s: %w", dir, err)
	}
	if err := unix.Stat(filepath.Dir(dir), &parent); err != nil {
		return false, fmt.Errorf("stat %s: %w", filepath.Dir(dir), err)
	}
	if st.Dev == parent.Dev {
		return false, nil
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return false, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return fs.Type == unix.TMPFS_MAGIC, nil
}

// unmountBundleFS detaches the bundle's tmpfs from the host; boxes that
// bind it keep their view until they end.
func unmountBundleFS(dir string) error {
	if dir == "" {
		return nil
	}
	if ours, err := isBundleFS(dir); err != nil || !ours {
		return err
	}
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount CA bundle tmpfs at %s: %w", dir, err)
	}
	return nil
}
