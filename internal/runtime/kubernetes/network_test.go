package kubernetes_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/kubernetes"
	"github.com/sbxdev/sbx/internal/runtime/kubernetes/k8stest"
	"github.com/sbxdev/sbx/internal/runtime/testsuite"
)

// reachPy first sends UDP datagrams to port argv[1] of every host in
// argv[2:], then tries a TCP connection to each HOST:PORT in argv[2:] (3 s
// each, at once) and prints "reached T" or "blocked T"; before all that
// it checks loopback still works ("loopback ok"), so a box with no
// network at all does not pass.
const reachPy = `
import concurrent.futures, socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
try:
    socket.create_connection(s.getsockname(), 3).close(); print("loopback ok")
except OSError as e:
    print("loopback broken", e)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for t in sys.argv[2:]:
    for i in range(3):
        try:
            u.sendto(b"sbx", (t.rsplit(":", 1)[0], int(sys.argv[1])))
        except OSError as e:
            pass
def try_(t):
    h, p = t.rsplit(":", 1)
    try:
        socket.create_connection((h.strip("[]"), int(p)), 3).close(); return "reached " + t
    except OSError as e:
        return "blocked %s %s" % (t, type(e).__name__)
with concurrent.futures.ThreadPoolExecutor(len(sys.argv)) as ex:
    for line in ex.map(try_, sys.argv[2:]):
        print(line)
`

// unfirewallPy is box root's attempts to undo the pod firewall, each
// printed as "NAME ok" or "NAME errno N":
//   - nft: delete the nftables table over nfnetlink (what "nft delete
//     table inet sbx_pod" sends: a batch with NFT_MSG_DELTABLE);
//   - raw4, raw6: open the raw socket the iptables setsockopts need;
//   - replace4, replace6: replace the IPv4/IPv6 filter table with one
//     accepting everything (IPT_SO_SET_REPLACE on a datagram socket, all a
//     box without raw sockets has).
const unfirewallPy = `
import ctypes, socket, struct
def attempt(name, f):
    try:
        f(); print(name, "ok")
    except OSError as e:
        print(name, "errno", e.errno)
def nft():
    NFNL_SUBSYS_NFTABLES, NFT_MSG_DELTABLE, NFPROTO_INET = 10, 2, 1
    def msg(typ, flags, family, resid, attrs=b""):
        body = struct.pack("BBH", family, 0, socket.htons(resid)) + attrs
        return struct.pack("=IHHII", 16 + len(body), typ, flags, 1, 0) + body
    name = b"sbx_pod\0"
    attr = struct.pack("=HH", 4 + len(name), 1) + name
    attr += b"\0" * (-len(attr) % 4)
    batch = (msg(0x10, 1, 0, NFNL_SUBSYS_NFTABLES) +
             msg((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_DELTABLE, 1 | 4, NFPROTO_INET, 0, attr) +
             msg(0x11, 1, 0, NFNL_SUBSYS_NFTABLES))
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12)
    s.settimeout(5)
    s.send(batch)
    r = s.recv(65536)
    typ, = struct.unpack_from("=H", r, 4)
    err, = struct.unpack_from("=i", r, 16) if typ == 2 else (0,)
    if err:
        raise OSError(-err, "nfnetlink")
counters = ctypes.create_string_buffer(16 * 64)
def replace(v6):
    es = 168 if v6 else 112
    def entry(target):
        e = bytearray(es)
        struct.pack_into("=HH", e, es - 28, es, es + len(target))
        return bytes(e) + target
    std = bytearray(40); struct.pack_into("=H", std, 0, 40); struct.pack_into("=i", std, 32, -2)
    err = bytearray(64); struct.pack_into("=H", err, 0, 64); err[2:7] = b"ERROR"; err[32:37] = b"ERROR"
    body = entry(bytes(std)) * 3 + entry(bytes(err))
    rep = bytearray(96); rep[0:6] = b"filter"
    struct.pack_into("=III", rep, 32, 0x0e, 4, len(body))
    for h in (1, 2, 3):
        struct.pack_into("=I", rep, 44 + 4 * h, (h - 1) * (es + 40))
        struct.pack_into("=I", rep, 64 + 4 * h, (h - 1) * (es + 40))
    struct.pack_into("=IQ", rep, 84, 10, ctypes.addressof(counters))
    s = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(41 if v6 else 0, 64, bytes(rep) + body)
attempt("nft", nft)
attempt("raw4", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW))
attempt("raw6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW))
attempt("replace4", lambda: replace(False))
attempt("replace6", lambda: replace(True))
`

// TestNetworkNoneAttack: code in a box (root, on the test cluster's
// bridge CNI, which enforces no NetworkPolicy) tries to reach the node
// (kubelet, a listener of the test's own on every host address), the API
// server (its endpoint and the kubernetes service's ClusterIP) and another
// box's pod over TCP (and sends UDP to a host listener), then tries to
// undo the pod firewall (unfirewallPy) and tries again. It reaches nothing
// (the host listeners see no connection and no datagram), every attempt is
// refused (EPERM), loopback works, and the daemon still drives the box. On the driver before the pod firewall the box reached
// every host address, the kubelet and the neighbour's agent. (The test
// cluster's API server is out of pods' reach on any driver: it listens on
// 127.0.0.1 and its ClusterIP answers the node only; the test still tries
// both.)
func TestNetworkNoneAttack(t *testing.T) { networkNoneAttack(t, "") }

// TestNetworkNoneAttackGvisor is the same attack from a box on RuntimeClass
// gvisor (where the cluster has it), whose pod firewall is the iptables
// backend in runsc's netstack: box root also tries to open the raw socket
// the iptables setsockopts need (NET_RAW is dropped; runsc runs with
// --net-raw) and to replace the filter tables.
func TestNetworkNoneAttackGvisor(t *testing.T) {
	skipWithoutGvisor(t)
	networkNoneAttack(t, "gvisor")
}

// TestNetworkNoneGvisorNFTablesFailsClosed: a gVisor RuntimeClass left on
// the nftables backend cannot program its firewall (runsc's netstack has
// no NETLINK_NETFILTER, and traffic from its netstack would bypass the pod
// netns's nftables anyway), so a create fails, saying why, leaves no pod,
// and the runtime's detail says its pods cannot be firewalled: no box
// runs with an unenforced mode none.
func TestNetworkNoneGvisorNFTablesFailsClosed(t *testing.T) {
	skipWithoutGvisor(t)
	c := k8stest.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, err := kubernetes.New(ctx, kubernetes.Config{
		Client: c.Client, Namespace: c.Namespace(t, "sbx-k8sdrv"), AgentImage: c.AgentImage(t), RuntimeClass: "gvisor",
		Firewall: "nftables", PullPolicy: corev1.PullNever, Logger: testLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	c.EnsurePyImage(t)
	h, err := d.Create(ctx, smallBox("gvisor"))
	if err == nil {
		_ = d.Destroy(ctx, h)
		t.Fatalf("creating a gvisor box with the nftables firewall: got a box, want the create refused")
	}
	if !strings.Contains(err.Error(), "sbx-firewall") || !strings.Contains(err.Error(), "protocol not supported") {
		t.Errorf("creating a gvisor box: got %v, want it to name sbx-firewall and the missing nftables", err)
	}
	if info := d.Info(ctx); !strings.Contains(info.Detail, "PODS CANNOT BE FIREWALLED") || !strings.Contains(info.Detail, "iptables") {
		t.Errorf("runtime detail after the refused create: got %q, want it to say pods cannot be firewalled and name iptables", info.Detail)
	}
	left, err := d.Leftovers(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("after the refused create: leftovers %v, want none", left)
	}
}

// skipWithoutGvisor skips tests of RuntimeClass gvisor on clusters
// without it.
func skipWithoutGvisor(t *testing.T) {
	t.Helper()
	c := k8stest.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Client.NodeV1().RuntimeClasses().Get(ctx, "gvisor", metav1.GetOptions{}); err != nil {
		t.Skipf("no RuntimeClass gvisor on the test cluster: %v", err)
	}
}

func networkNoneAttack(t *testing.T, class string) {
	d := newDriverFunc(t, class)(t)
	c := k8stest.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// A host service, counting who connects to it.
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			conn.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	// And a UDP one, counting datagrams. The box sends them before its TCP
	// attempts, each of which waits 3 s on a blocked target, so a
	// datagram that got through has long arrived when the count is read.
	udp, err := net.ListenPacket("udp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	var datagrams atomic.Int32
	go func() {
		buf := make([]byte, 64)
		for {
			if _, _, err := udp.ReadFrom(buf); err != nil {
				return
			}
			datagrams.Add(1)
		}
	}()
	udpPort := fmt.Sprint(udp.LocalAddr().(*net.UDPAddr).Port)
	var targets []string
	ifs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range ifs {
		if ip, ok := a.(*net.IPNet); ok && ip.IP.To4() != nil && !ip.IP.IsLoopback() {
			targets = append(targets, fmt.Sprintf("%s:%d", ip.IP, port))
		}
	}

	// The cluster's services: kubelet on the node, the API server.
	nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				targets = append(targets, net.JoinHostPort(a.Address, "10250"))
			}
		}
	}
	svc, err := c.Client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	targets = append(targets, net.JoinHostPort(svc.Spec.ClusterIP, "443"))
	slices, err := c.Client.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=kubernetes"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slices.Items {
		for _, e := range s.Endpoints {
			for _, p := range s.Ports {
				if p.Port != nil && len(e.Addresses) > 0 {
					targets = append(targets, net.JoinHostPort(e.Addresses[0], fmt.Sprint(*p.Port)))
				}
			}
		}
	}

	// Another box's pod: its agent listens on 7700.
	other := testsuite.Create(t, d, smallBox("neighbour"))
	var hd struct {
		IP string `json:"ip"`
	}
	if err := json.Unmarshal(other.Data, &hd); err != nil || net.ParseIP(hd.IP) == nil {
		t.Fatalf("neighbour handle %s: no pod ip (%v)", other.Data, err)
	}
	targets = append(targets, net.JoinHostPort(hd.IP, "7700"))

	// A target counts if it answers the test (on the node), so a blocked
	// connection from the box is the box's firewall, not a dead target.
	// The test cluster's API server listens on 127.0.0.1 only (and has no
	// kube-proxy for its ClusterIP): pods cannot reach it on any driver,
	// and the test says so rather than count it.
	live := targets[:0:0]
	for _, tg := range targets {
		conn, err := net.DialTimeout("tcp", tg, 3*time.Second)
		if err != nil {
			t.Logf("target %s does not answer the node either (%v): not counted", tg, err)
			continue
		}
		conn.Close()
		live = append(live, tg)
	}
	if len(live) < 3 {
		t.Fatalf("targets answering the node: %v, want the host listener, the kubelet and the neighbour's agent at least", live)
	}
	targets = live
	seen := accepted.Load()

	box := testsuite.Create(t, d, smallBox("attacker"))
	reach := func(when string) {
		t.Helper()
		r := testsuite.MustExec(t, d, box, append([]string{"/usr/bin/python3", "-c", reachPy, udpPort}, targets...)...)
		t.Logf("%s:\n%s%s", when, r.Stdout, r.Stderr)
		if !strings.Contains(r.Stdout, "loopback ok") {
			t.Errorf("%s: loopback in the box: got %q, want it working", when, r.Stdout)
		}
		for _, tg := range targets {
			if !strings.Contains(r.Stdout, "blocked "+tg+" ") {
				t.Errorf("%s: connecting to %s from a box in mode none: not blocked, want it blocked", when, tg)
			}
		}
	}
	reach("before the attempts to undo the firewall")
	r := testsuite.MustExec(t, d, box, "/usr/bin/python3", "-c", unfirewallPy)
	t.Logf("undoing the firewall: %s%s", r.Stdout, r.Stderr)
	// EPERM (1) is the capability check; gVisor refuses the x_tables
	// setsockopts on anything but a raw socket first (ENOPROTOOPT, 92) and
	// has no nfnetlink (EPROTONOSUPPORT, 93).
	refused := map[string]int{"nft": 1, "raw4": 1, "raw6": 1, "replace4": 1, "replace6": 1}
	if class == "gvisor" {
		refused["nft"], refused["replace4"], refused["replace6"] = 93, 92, 92
	}
	for name, errno := range refused {
		var got string
		for _, l := range strings.Split(r.Stdout, "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[0] == name {
				got = strings.Join(f[1:], " ")
			}
		}
		if want := fmt.Sprintf("errno %d", errno); got != want {
			t.Errorf("box root's attempt %s on %q pods: got %q, want %q", name, class, got, want)
		}
	}
	reach("after the attempts to undo the firewall")
	if n := accepted.Load() - seen; n != 0 {
		t.Errorf("the host listener saw %d connections from the box, want none", n)
	}
	if n := datagrams.Load(); n != 0 {
		t.Errorf("the host's UDP listener got %d datagrams from the box, want none", n)
	}
}

// smallBox asks for a tenth of a CPU: the test node has two, shared with
// other tests.
func smallBox(name string) runtime.Spec {
	s := withImage(testsuite.NewSpec(name))
	s.Resources.CPUMillis = 100
	return s
}

// TestNetworkPolicyObject: the driver keeps a NetworkPolicy for clusters
// whose CNI enforces it (the test cluster's does not, so this checks the
// object, not its enforcement): it selects the driver's box pods, admits
// TCP to the agent's two ports only and allows no egress; a new driver
// (a restarted daemon) puts back a policy someone loosened.
func TestNetworkPolicyObject(t *testing.T) {
	c := k8stest.Get(t)
	newDriver := newDriverFunc(t, "")
	d := newDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	box := testsuite.Create(t, d, smallBox("polbox"))
	var hd struct {
		NS  string `json:"ns"`
		Pod string `json:"pod"`
	}
	if err := json.Unmarshal(box.Data, &hd); err != nil {
		t.Fatal(err)
	}
	pod, err := c.Client.CoreV1().Pods(hd.NS).Get(ctx, hd.Pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	api := c.Client.NetworkingV1().NetworkPolicies(hd.NS)
	check := func(when string) {
		t.Helper()
		list, err := api.List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) != 1 {
			t.Fatalf("%s: got %d network policies in %s, want 1", when, len(list.Items), hd.NS)
		}
		p := list.Items[0]
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err != nil {
			t.Fatal(err)
		}
		if !sel.Matches(labels.Set(pod.Labels)) {
			t.Errorf("%s: policy %s selector %s does not select the box's pod (labels %v)", when, p.Name, sel, pod.Labels)
		}
		if got := fmt.Sprint(p.Spec.PolicyTypes); got != "[Ingress Egress]" {
			t.Errorf("%s: policy types %s, want [Ingress Egress]", when, got)
		}
		if len(p.Spec.Egress) != 0 {
			t.Errorf("%s: egress rules %+v, want none", when, p.Spec.Egress)
		}
		var ports []string
		for _, r := range p.Spec.Ingress {
			if len(r.From) != 0 {
				t.Errorf("%s: ingress from %+v, want any source", when, r.From)
			}
			for _, port := range r.Ports {
				ports = append(ports, fmt.Sprintf("%s/%s", *port.Protocol, port.Port))
			}
		}
		if got := strings.Join(ports, ","); got != "TCP/7700,TCP/7701" {
			t.Errorf("%s: ingress ports %s, want TCP/7700,TCP/7701", when, got)
		}
	}
	check("after New")

	list, err := api.List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("listing policies: %v", err)
	}
	loose := list.Items[0]
	loose.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{}} // allow all
	if _, err := api.Update(ctx, &loose, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	newDriver(t)
	check("after a loosened policy and a new driver")
}
