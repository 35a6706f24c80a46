package integration

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
)

// testInternet is a network namespace standing in for the internet and the
// private networks around a host. Every address it serves is routed to it
// by host routes the test adds (and removes), so even a broken firewall
// sends nothing off this machine.
type testInternet struct {
	ns       string // name under /run/netns
	hostVeth string
	hostAddr string // the host's end of the link (a host address)
	// Where the test's servers listen, all inside the namespace.
	public, allowed, blocked, private, cgnat, metadata string
	dns                                                string // host:port
}

// Addresses of the test internet. 198.51.100.0/24 (TEST-NET-2) stands for
// public hosts; the others are in ranges sandboxes must not reach.
const (
	inetPublic   = "198.51.100.10"
	inetAllowed  = "198.51.100.11"
	inetBlocked  = "198.51.100.12"
	inetPrivate  = "10.77.0.10"
	inetCGNAT    = "100.64.0.10"
	inetMetadata = "169.254.169.254"
	inetLinkHost = "10.77.255.1" // host end of the veth
	inetLinkPeer = "10.77.255.2"
)

// testZone is what the test DNS server answers.
var testZone = map[string]string{
	"public.test":       inetPublic,
	"a.allowed.test":    inetAllowed,
	"blocked.test":      inetBlocked,
	"api.secret.test":   inetPublic,
	"other.test":        inetBlocked,
	"meta.allowed.test": inetMetadata,
}

// echoHandler says which server answered and what it was sent (the
// headers and query the egress proxy may have rewritten): it is the
// echoing host that would hand a secret back to a box.
func echoHandler(addr string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s\nhost=%s\nauth=%s\nquery=%s\n", addr, r.Host, r.Header.Get("Authorization"), r.URL.RawQuery)
		for _, k := range slices.Sorted(maps.Keys(r.Header)) {
			if k != "Authorization" {
				fmt.Fprintf(w, "hdr %s=%s\n", k, strings.Join(r.Header[k], ","))
			}
		}
	})
}

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
}

func tryRun(args ...string) { _ = exec.Command(args[0], args[1:]...).Run() }

func randTag() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newTestInternet builds the namespace, its link to the host, the routes
// and the servers; t.Cleanup removes all of it.
func newTestInternet(t *testing.T) *testInternet {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs the ip command (iproute2)")
	}
	tag := randTag()
	in := &testInternet{ns: "sbxe2e-" + tag, hostVeth: "sbxe2eh" + tag, hostAddr: inetLinkHost}
	peer := "sbxe2ei" + tag
	served := []string{inetPublic, inetAllowed, inetBlocked, inetPrivate, inetCGNAT, inetMetadata}
	t.Cleanup(func() {
		for _, a := range served {
			tryRun("ip", "route", "del", a+"/32", "dev", in.hostVeth)
		}
		tryRun("ip", "link", "del", in.hostVeth)
		tryRun("ip", "netns", "del", in.ns)
	})
	run(t, "ip", "netns", "add", in.ns)
	run(t, "ip", "link", "add", in.hostVeth, "type", "veth", "peer", "name", peer, "netns", in.ns)
	run(t, "ip", "addr", "add", inetLinkHost+"/30", "dev", in.hostVeth)
	run(t, "ip", "link", "set", in.hostVeth, "up")
	nsRun := func(args ...string) { run(t, append([]string{"ip", "netns", "exec", in.ns}, args...)...) }
	nsRun("ip", "addr", "add", inetLinkPeer+"/30", "dev", peer)
	nsRun("ip", "link", "set", peer, "up")
	nsRun("ip", "link", "set", "lo", "up")
	for _, a := range served {
		nsRun("ip", "addr", "add", a+"/32", "dev", "lo")
		run(t, "ip", "route", "add", a+"/32", "via", inetLinkPeer, "dev", in.hostVeth)
	}
	nsPath := "/run/netns/" + in.ns
	for _, a := range served {
		ln := listenIn(t, nsPath, "tcp", a+":80").(net.Listener)
		srv := &http.Server{Handler: echoHandler(a)}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { srv.Close() })
	}
	in.public, in.allowed, in.blocked = inetPublic, inetAllowed, inetBlocked
	in.private, in.cgnat, in.metadata = inetPrivate, inetCGNAT, inetMetadata
	in.dns = inetPublic + ":53"
	pc := listenIn(t, nsPath, "udp", in.dns).(net.PacketConn)
	go serveTestDNS(pc)
	return in
}

// listenIn opens a listener inside the namespace at nsPath: the socket stays
// there while the test's goroutines serve it. t.Cleanup closes it.
func listenIn(t *testing.T, nsPath, network, addr string) io.Closer {
	t.Helper()
	type result struct {
		c   io.Closer
		err error
	}
	ch := make(chan result)
	go func() {
		goruntime.LockOSThread() // not unlocked if restoring fails: the thread dies
		orig, err := netns.Get()
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer orig.Close()
		ns, err := netns.GetFromPath(nsPath)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			ch <- result{err: err}
			return
		}
		var r result
		if network == "udp" {
			r.c, r.err = net.ListenPacket(network, addr)
		} else {
			r.c, r.err = net.Listen(network, addr)
		}
		if netns.Set(orig) == nil {
			goruntime.UnlockOSThread()
		}
		ch <- r
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("listen on %s %s in %s: %v", network, addr, nsPath, r.err)
	}
	t.Cleanup(func() { r.c.Close() })
	return r.c
}

// serveTestDNS answers A queries for testZone, NODATA for other types of
// known names and NXDOMAIN for the rest.
func serveTestDNS(pc net.PacketConn) {
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		q := buf[:n]
		if n < 12 {
			continue
		}
		var labels []string
		off := 12
		for off < n && q[off] != 0 && off+1+int(q[off]) <= n {
			labels = append(labels, string(q[off+1:off+1+int(q[off])]))
			off += 1 + int(q[off])
		}
		if off+5 > n {
			continue
		}
		qtype := binary.BigEndian.Uint16(q[off+1:])
		r := append([]byte(nil), q[:off+5]...)
		r[2], r[3] = 0x85, 0x80
		binary.BigEndian.PutUint16(r[6:], 0)
		binary.BigEndian.PutUint16(r[8:], 0)
		binary.BigEndian.PutUint16(r[10:], 0)
		addr, ok := testZone[strings.ToLower(strings.Join(labels, "."))]
		switch {
		case !ok:
			r[3] |= 3
		case qtype == 1:
			binary.BigEndian.PutUint16(r[6:], 1)
			r = append(r, 0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4)
			r = append(r, net.ParseIP(addr).To4()...)
		}
		_, _ = pc.WriteTo(r, from)
	}
}

// removeNetworking deletes a daemon's bridge and nftables table (a daemon
// leaves them for its sandboxes when it stops) and its lock files.
func removeNetworking(bridge, table string) {
	_ = os.Remove("/run/sbx/bridge-" + bridge + ".lock")
	_ = os.Remove("/run/sbx/table-" + table + ".lock")
	tryRun("ip", "link", "del", bridge)
	if c, err := nftables.New(); err == nil {
		for _, f := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyBridge} {
			t := &nftables.Table{Name: table, Family: f}
			c.AddTable(t)
			c.DelTable(t)
		}
		_ = c.Flush()
	}
}

// nftElementsOf lists the elements of a table's sets that are the box at
// ip's ("set key" for each; the table keys every box's state by address),
// and its port guard binding in the bridge table of the same name.
func nftElementsOf(t *testing.T, table, ip string) []string {
	t.Helper()
	a, err := netip.ParseAddr(ip)
	if err != nil {
		t.Fatalf("box address %q: %v", ip, err)
	}
	key := a.As4()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	sets, err := c.GetSets(&nftables.Table{Name: table, Family: nftables.TableFamilyINet})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range sets {
		els, err := c.GetSetElements(s)
		if err != nil {
			t.Fatalf("elements of %s: %v", s.Name, err)
		}
		for _, el := range els {
			if len(el.Key) >= 4 && string(el.Key[:4]) == string(key[:]) {
				out = append(out, s.Name+" "+hex.EncodeToString(el.Key))
			}
		}
	}
	// The port guard's binding (bridge table, veth . MAC . address).
	if ports, err := c.GetSetByName(&nftables.Table{Name: table, Family: nftables.TableFamilyBridge}, "ports"); err == nil {
		els, err := c.GetSetElements(ports)
		if err != nil {
			t.Fatalf("elements of the bridge table's ports: %v", err)
		}
		for _, el := range els {
			if len(el.Key) == 28 && string(el.Key[24:]) == string(key[:]) {
				out = append(out, "bridge ports "+hex.EncodeToString(el.Key))
			}
		}
	}
	return out
}

func linkExists(name string) bool {
	_, err := os.Stat("/sys/class/net/" + name)
	return err == nil
}
