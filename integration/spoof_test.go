package integration

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestSpoofedFramesDropped: a box cannot speak on the bridge as a
// neighbour, on either runtime. User code cannot forge frames (no raw
// sockets, no address changes: TestGvisorNetwork and TestNetworkPolicies
// check that), so the attack is what code holding the box's end of the veth
// can do: under gvisor, runsc's sandbox process keeps an AF_PACKET socket
// on it, so a takeover of gVisor's kernel gets exactly this; under oci a
// host kernel escape. The test writes frames on eth0 in the attacker box's
// own network namespace with the addresses of a public neighbour: a UDP
// datagram as the neighbour to a public address the attacker's allow-list
// does not cover, an ARP request claiming the neighbour's address, and a
// frame from the neighbour's MAC. The host must not forward the datagram
// (no conntrack entry for it, nothing at the server), keep the neighbour's
// ARP entry and keep the neighbour's MAC on the neighbour's bridge port.
// Each attack ends with a legitimate ARP request from the attacker, sent
// from the same CPU: once its reply is back the host has processed the
// spoofed frame too.
func TestSpoofedFramesDropped(t *testing.T) {
	runsc := runscForTests(t)
	d := startNetDaemon(t, "--runsc", runsc)
	ctx := ctxT(t, 5*time.Minute)
	in := d.inet
	br, err := net.InterfaceByName(d.bridge)
	if err != nil {
		t.Fatal(err)
	}
	for i, rt := range []string{"gvisor", "oci"} {
		t.Run(rt, func(t *testing.T) {
			create := func(p *sbx.NetworkPolicy) *sbx.Sandbox {
				t.Helper()
				sb, err := d.client().Create(ctx, sbx.CreateOptions{Runtime: rt, Network: p})
				if err != nil {
					t.Fatalf("create on %s with %+v: %v", rt, p, err)
				}
				d.remember(sb.ID)
				return sb
			}
			victim := create(nil)
			attacker := create(&sbx.NetworkPolicy{Mode: "allow", AllowCIDRs: []string{in.allowed + "/32"}})
			// The victim talks to the gateway: the host has its ARP entry.
			if got := resolve(t, ctx, victim, "public.test"); got != in.public {
				t.Fatalf("victim resolves public.test to %q, want %s", got, in.public)
			}
			vIP, aIP := victim.Info.GetIpAddress(), attacker.Info.GetIpAddress()
			vNS, vVeth := d.slotOf(t, victim.ID)
			aNS, aVeth := d.slotOf(t, attacker.ID)
			vMAC, aMAC := eth0MAC(t, vNS), eth0MAC(t, aNS)
			if got := hostNeigh(t, d.bridge, vIP); got != vMAC.String() {
				t.Fatalf("host's ARP entry for the victim %s: %q, want %s", vIP, got, vMAC)
			}
			port := 40000 + i
			srv := listenIn(t, "/run/netns/"+in.ns, "udp", fmt.Sprintf("%s:%d", in.public, port)).(net.PacketConn)
			raw := packetSocket(t, aNS)
			aAddr, vAddr := netip.MustParseAddr(aIP), netip.MustParseAddr(vIP)
			gw := netip.MustParseAddr(d.gateway)
			bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

			// As the victim, to where the attacker may not go.
			udp := ipv4UDP(vAddr, netip.MustParseAddr(in.public), 5353, uint16(port), []byte("spoofed-"+rt))
			raw.sendThenSync(t, ether(br.HardwareAddr, aMAC, unix.ETH_P_IP, udp), aMAC, aAddr, gw)
			if got := conntrackFrom(t, vIP, in.public, port); got != "" {
				t.Errorf("the host forwarded a datagram with the victim's address from the attacker's port: %s", got)
			}
			_ = srv.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			if n, _, err := srv.ReadFrom(make([]byte, 100)); err == nil {
				t.Errorf("the server at %s got a %d-byte datagram sent as the victim", in.public, n)
			}

			// ARP: a request for the gateway "from" the victim's address at
			// the attacker's MAC (the host takes the sender's pair from a
			// request, whatever its ARP locktime).
			req := arp(1, aMAC, vAddr, make(net.HardwareAddr, 6), gw)
			raw.sendThenSync(t, ether(bcast, aMAC, unix.ETH_P_ARP, req), aMAC, aAddr, gw)
			if got := hostNeigh(t, d.bridge, vIP); got != vMAC.String() {
				t.Errorf("host's ARP entry for the victim %s after the attacker's ARP: %q, want %s", vIP, got, vMAC)
			}
			// The victim's MAC from the attacker's port: the bridge must not
			// learn it there.
			raw.sendThenSync(t, ether(bcast, vMAC, unix.ETH_P_IP, udp), aMAC, aAddr, gw)
			if out := fdbOf(t, d.bridge, vMAC); strings.Contains(out, aVeth) || !strings.Contains(out, vVeth) {
				t.Errorf("bridge fdb for the victim's MAC %s: %q, want it on %s, not %s", vMAC, out, vVeth, aVeth)
			}
			// The same MAC in other shapes of frame, each checked on its
			// own after the victim (its own frame from its own port) has
			// taught the bridge its port again: VLAN-tagged IPv4 (the
			// kernel untags it before the bridge), IPv6, 802.3 (a length,
			// not an ethertype) and an ARP reply. Without the guard each
			// moves the victim's MAC to the attacker's port.
			vRaw := packetSocket(t, vNS)
			for _, fr := range []struct {
				name  string
				frame []byte
			}{
				{"vlan-tagged ipv4", ether(bcast, vMAC, 0x8100, append([]byte{0, 7, 8, 0}, udp...))},
				{"ipv6", ether(bcast, vMAC, unix.ETH_P_IPV6, append([]byte{0x60, 0, 0, 0, 0, 8, 17, 64}, make([]byte, 40)...))},
				{"802.3", ether(bcast, vMAC, 46, append([]byte{0x42, 0x42, 0x03}, make([]byte, 43)...))},
				{"arp reply", ether(br.HardwareAddr, vMAC, unix.ETH_P_ARP, arp(2, vMAC, vAddr, br.HardwareAddr, gw))},
			} {
				vRaw.sendThenSync(t, ether(bcast, vMAC, unix.ETH_P_IP, ipv4UDP(vAddr, gw, 5353, 9, []byte("teach"))), vMAC, vAddr, gw)
				if out := fdbOf(t, d.bridge, vMAC); !strings.Contains(out, vVeth) {
					t.Fatalf("bridge fdb for the victim's MAC %s after its traffic: %q, want it on %s", vMAC, out, vVeth)
				}
				raw.sendThenSync(t, fr.frame, aMAC, aAddr, gw)
				if out := fdbOf(t, d.bridge, vMAC); strings.Contains(out, aVeth) || !strings.Contains(out, vVeth) {
					t.Errorf("%s frame from the victim's MAC: bridge fdb for %s: %q, want it on %s, not %s", fr.name, vMAC, out, vVeth, aVeth)
				}
			}
			// Root in the box cannot re-address its end of the veth (no
			// CAP_NET_ADMIN over the namespace under oci; gVisor's netstack
			// is not the veth under gvisor): eth0's MAC and addresses, as
			// the host sees them, stay what the guard binds.
			res, err := attacker.RunShell(ctx, "ip link set dev eth0 address "+vMAC.String()+" 2>&1; ip addr add "+vIP+"/32 dev eth0 2>&1; true")
			if err != nil {
				t.Fatal(err)
			}
			if got := eth0MAC(t, aNS); got.String() != aMAC.String() {
				t.Errorf("the attacker's eth0 MAC after its ip link set: got %s, want %s (ip said %q)", got, aMAC, res.Stdout)
			}
			if rt == "oci" && !strings.Contains(string(res.Stdout), "Operation not permitted") {
				t.Errorf("ip link/addr in the oci box: got %q, want Operation not permitted", res.Stdout)
			}
			// The box itself is unharmed by the guard.
			if !reach(t, ctx, victim, in.public) {
				t.Errorf("the victim cannot reach %s", in.public)
			}
			if !reach(t, ctx, attacker, in.allowed) {
				t.Errorf("the attacker cannot reach its allowed %s", in.allowed)
			}
		})
	}
}

// slotOf returns the network namespace path and host veth of box id.
func (d *netDaemon) slotOf(t *testing.T, id string) (string, string) {
	t.Helper()
	for _, s := range d.state(t).Slots {
		if s.Owner == id {
			return filepath.Join(d.dataDir, "network", "ns", s.Name), s.Veth
		}
	}
	t.Fatalf("no network slot for %s", id)
	return "", ""
}

// eth0MAC reads the MAC of eth0 in the namespace at nsPath.
func eth0MAC(t *testing.T, nsPath string) net.HardwareAddr {
	t.Helper()
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().HardwareAddr
}

// hostNeigh is the MAC of the host's ARP entry for ip on dev ("" if none).
func hostNeigh(t *testing.T, dev, ip string) string {
	t.Helper()
	out, err := exec.Command("ip", "neigh", "show", ip, "dev", dev).CombinedOutput()
	if err != nil {
		t.Fatalf("ip neigh: %v: %s", err, out)
	}
	f := strings.Fields(string(out))
	for i, w := range f {
		if w == "lladdr" && i+1 < len(f) {
			return f[i+1]
		}
	}
	return ""
}

// fdbOf lists the bridge's forwarding entries for mac.
func fdbOf(t *testing.T, bridge string, mac net.HardwareAddr) string {
	t.Helper()
	out, err := exec.Command("bridge", "fdb", "show", "br", bridge).CombinedOutput()
	if err != nil {
		t.Fatalf("bridge fdb: %v: %s", err, out)
	}
	var lines []string
	for l := range strings.SplitSeq(string(out), "\n") {
		if strings.HasPrefix(l, mac.String()+" ") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "; ")
}

// conntrackFrom returns the host's conntrack entry for UDP src → dst:dport.
func conntrackFrom(t *testing.T, src, dst string, dport int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/net/nf_conntrack")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("src=%s dst=%s sport=5353 dport=%d ", src, dst, dport)
	for l := range strings.SplitSeq(string(b), "\n") {
		if strings.Contains(l, want) {
			return l
		}
	}
	return ""
}

// rawPort is an AF_PACKET socket on eth0 of a box's namespace.
type rawPort struct{ fd, ifindex int }

// packetSocket opens a packet socket bound to eth0 in the namespace at
// nsPath (it stays there; the thread goes back to the host's).
func packetSocket(t *testing.T, nsPath string) *rawPort {
	t.Helper()
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := netns.Set(ns); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(err) // the locked thread must not go back to the pool in the box's namespace
		}
	}()
	ifi, err := net.InterfaceByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ARP)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: ifi.Index}); err != nil {
		t.Fatal(err)
	}
	return &rawPort{fd: fd, ifindex: ifi.Index}
}

// sendThenSync writes frame, then a legitimate ARP request (from mac and
// ip, for gw) from the same CPU, and waits for the gateway's reply: frames
// from one veth sent on one CPU are processed in order, so the host has
// handled frame (and whatever it queued) by then.
func (r *rawPort) sendThenSync(t *testing.T, frame []byte, mac net.HardwareAddr, ip, gw netip.Addr) {
	t.Helper()
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	var old, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		t.Fatal(err)
	}
	for c := 0; c < 1024; c++ {
		if old.IsSet(c) {
			one.Set(c)
			break
		}
	}
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.SchedSetaffinity(0, &old) }()
	to := &unix.SockaddrLinklayer{Ifindex: r.ifindex, Halen: 6}
	if err := unix.Sendto(r.fd, frame, 0, to); err != nil {
		t.Fatalf("send spoofed frame: %v", err)
	}
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	if err := unix.Sendto(r.fd, ether(bcast, mac, unix.ETH_P_ARP, arp(1, mac, ip, make(net.HardwareAddr, 6), gw)), 0, to); err != nil {
		t.Fatalf("send ARP request: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	buf := make([]byte, 1500)
	for time.Now().Before(deadline) {
		tv := unix.NsecToTimeval(int64(time.Second))
		_ = unix.SetsockoptTimeval(r.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		n, _, err := unix.Recvfrom(r.fd, buf, 0)
		if err != nil {
			continue
		}
		// An ARP reply (op 2) from gw to ip.
		a := buf[14:n]
		gwb, ipb := gw.As4(), ip.As4()
		if n >= 42 && binary.BigEndian.Uint16(a[6:8]) == 2 && bytes.Equal(a[14:18], gwb[:]) && bytes.Equal(a[24:28], ipb[:]) {
			return
		}
	}
	t.Fatalf("no ARP reply from the gateway %s to %s", gw, ip)
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// ether is an Ethernet frame.
func ether(dst, src net.HardwareAddr, typ uint16, payload []byte) []byte {
	f := append(append(append([]byte{}, dst...), src...), byte(typ>>8), byte(typ))
	return append(f, payload...)
}

// arp is an Ethernet/IPv4 ARP message.
func arp(op uint16, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr) []byte {
	b := []byte{0, 1, 8, 0, 6, 4, 0, byte(op)}
	s, d := spa.As4(), tpa.As4()
	b = append(append(b, sha...), s[:]...)
	return append(append(b, tha...), d[:]...)
}

// ipv4UDP is an IPv4 packet holding a UDP datagram (UDP checksum 0: none).
func ipv4UDP(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	total := 20 + 8 + len(payload)
	h := []byte{0x45, 0, byte(total >> 8), byte(total), 0, 1, 0x40, 0, 64, unix.IPPROTO_UDP, 0, 0}
	s, d := src.As4(), dst.As4()
	h = append(append(h, s[:]...), d[:]...)
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(h[10:], ^uint16(sum))
	u := binary.BigEndian.AppendUint16(nil, sport)
	u = binary.BigEndian.AppendUint16(u, dport)
	u = binary.BigEndian.AppendUint16(u, uint16(8+len(payload)))
	u = append(u, 0, 0)
	return append(append(h, u...), payload...)
}
