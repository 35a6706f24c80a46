package network

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ensureBridge creates (or adopts) the bridge with gw/bits as its address,
// up, with IPv6 off, and turns on IPv4 forwarding.
func ensureBridge(name string, gw netip.Addr, bits int) (int, error) {
	br, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return 0, fmt.Errorf("look up bridge %s: %w", name, err)
		}
		la := netlink.NewLinkAttrs()
		la.Name = name
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil && !errors.Is(err, unix.EEXIST) {
			return 0, fmt.Errorf("create bridge %s: %w", name, err)
		}
		if br, err = netlink.LinkByName(name); err != nil {
			return 0, fmt.Errorf("look up bridge %s: %w", name, err)
		}
	}
	if br.Type() != "bridge" {
		return 0, fmt.Errorf("%s exists and is a %s, not a bridge", name, br.Type())
	}
	// A fixed MAC: otherwise the bridge takes the lowest of its ports' and
	// changes it as veths come and go, leaving boxes' ARP entries for the
	// gateway stale (no traffic until they expire).
	if mac := bridgeMAC(name); br.Attrs().HardwareAddr.String() != mac.String() {
		if err := netlink.LinkSetHardwareAddr(br, mac); err != nil {
			return 0, fmt.Errorf("set MAC of bridge %s: %w", name, err)
		}
	}
	_ = writeSysctl("net/ipv6/conf/"+name+"/disable_ipv6", "1")
	want := &netlink.Addr{IPNet: &net.IPNet{IP: gw.AsSlice(), Mask: net.CIDRMask(bits, 32)}}
	addrs, err := netlink.AddrList(br, unix.AF_INET)
	if err != nil {
		return 0, fmt.Errorf("list addresses of %s: %w", name, err)
	}
	have := false
	for _, a := range addrs {
		if a.IPNet.String() == want.IPNet.String() {
			have = true
		} else if err := netlink.AddrDel(br, &a); err != nil {
			return 0, fmt.Errorf("remove stale address %s from %s: %w", a.IPNet, name, err)
		}
	}
	if !have {
		if err := netlink.AddrAdd(br, want); err != nil {
			return 0, fmt.Errorf("address bridge %s: %w", name, err)
		}
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return 0, fmt.Errorf("bring up bridge %s: %w", name, err)
	}
	// Routing between the bridge and the uplinks. Global, like every
	// container engine; the firewall decides what may pass.
	if b, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); strings.TrimSpace(string(b)) != "1" {
		if err := writeSysctl("net/ipv4/ip_forward", "1"); err != nil {
			return 0, fmt.Errorf("enable IPv4 forwarding: %w", err)
		}
	}
	return br.Attrs().Index, nil
}

// bridgeMAC is a locally administered unicast MAC derived from the name.
func bridgeMAC(name string) net.HardwareAddr {
	h := fnv.New32a()
	h.Write([]byte(name))
	v := h.Sum32()
	return net.HardwareAddr{0x02, 0x5b, byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}
}

func writeSysctl(key, val string) error {
	return os.WriteFile("/proc/sys/"+key, []byte(val), 0o644)
}

// createNetNS makes a network namespace with loopback up and IPv6 off, and
// bind-mounts it at path.
func createNetNS(path string) (err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("create netns file: %w", err)
	}
	f.Close()
	defer func() {
		if err != nil {
			_ = os.Remove(path)
		}
	}()
	goruntime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		goruntime.UnlockOSThread()
		return fmt.Errorf("get current netns: %w", err)
	}
	defer orig.Close()
	restored := false
	defer func() {
		if restored {
			goruntime.UnlockOSThread()
		} // else the thread stays locked and dies with this goroutine
	}()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		restored = true
		return fmt.Errorf("unshare netns: %w", err)
	}
	setupErr := func() error {
		// Before any interface exists, so eth0 inherits "default".
		for _, k := range []string{"all", "default"} {
			if err := writeSysctl("net/ipv6/conf/"+k+"/disable_ipv6", "1"); err != nil {
				return fmt.Errorf("disable IPv6 in netns: %w", err)
			}
		}
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			return fmt.Errorf("bring up loopback: %w", err)
		}
		if err := unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mount netns: %w", err)
		}
		return nil
	}()
	if err := netns.Set(orig); err != nil {
		return fmt.Errorf("return to host netns: %w", err)
	}
	restored = true
	return setupErr
}

// removeNetNS unmounts and removes a namespace file; a missing one is fine.
func removeNetNS(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", path, err)
	}
	return nil
}

// addVeth creates veth host⇄eth0 with eth0 inside the namespace at nsPath,
// with MAC boxMAC(ip), addressed ip/bits with a default route via gw, and the host end enslaved
// to the bridge as an isolated port in interface group group.
func addVeth(nsFile, host string, bridgeIndex int, group uint32, ip, gw netip.Addr, bits int) (err error) {
	ns, err := netns.GetFromPath(nsFile)
	if err != nil {
		return fmt.Errorf("open netns: %w", err)
	}
	defer ns.Close()
	la := netlink.NewLinkAttrs()
	la.Name = host
	la.MasterIndex = bridgeIndex
	la.Flags = net.FlagUp
	la.Group = group // guarded from the start (portguard_linux.go)
	// eth0's MAC is fixed by its address: the port guard lets in only
	// frames from it.
	veth := &netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns)), PeerHardwareAddr: boxMAC(ip)}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth %s: %w", host, err)
	}
	defer func() {
		if err != nil {
			_ = deleteLink(host)
		}
	}()
	hl, err := netlink.LinkByName(host)
	if err != nil {
		return fmt.Errorf("look up veth %s: %w", host, err)
	}
	if err := netlink.LinkSetIsolated(hl, true); err != nil {
		return fmt.Errorf("isolate bridge port %s: %w", host, err)
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink in netns: %w", err)
	}
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("look up eth0 in netns: %w", err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(bits, 32)}}
	if err := h.AddrAdd(eth, addr); err != nil {
		return fmt.Errorf("address eth0: %w", err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return fmt.Errorf("bring up eth0: %w", err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
		return fmt.Errorf("default route in netns: %w", err)
	}
	return nil
}

// deleteLink removes a link (and so its veth peer); a missing one is fine.
func deleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

// bridgePorts lists the names of links enslaved to the bridge.
func bridgePorts(bridgeIndex int) ([]string, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range links {
		if l.Attrs().MasterIndex == bridgeIndex {
			out = append(out, l.Attrs().Name)
		}
	}
	return out, nil
}

// linkCounters reads a link's counters from sysfs.
func linkCounters(name string) (rxB, txB, rxP, txP int64, err error) {
	read := func(f string) int64 {
		if err != nil {
			return 0
		}
		var b []byte
		b, err = os.ReadFile(filepath.Join("/sys/class/net", name, "statistics", f))
		var v int64
		_, _ = fmt.Sscan(string(b), &v)
		return v
	}
	return read("rx_bytes"), read("tx_bytes"), read("rx_packets"), read("tx_packets"), err
}
