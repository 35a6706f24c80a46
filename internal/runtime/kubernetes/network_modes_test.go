package kubernetes_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/kubernetes"
	"github.com/sbxdev/sbx/internal/runtime/kubernetes/k8stest"
	"github.com/sbxdev/sbx/internal/runtime/testsuite"
)

// countingListener is a host service on every host address that counts
// connections by the address they reached.
type countingListener struct {
	port int
	mu   sync.Mutex
	by   map[string]int // local address -> connections
}

func listenCounting(t *testing.T) *countingListener {
	t.Helper()
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	l := &countingListener{port: ln.Addr().(*net.TCPAddr).Port, by: map[string]int{}}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			a := conn.LocalAddr().(*net.TCPAddr).IP.String()
			l.mu.Lock()
			l.by[a]++
			l.mu.Unlock()
			conn.Close()
		}
	}()
	return l
}

func (l *countingListener) count(addr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.by[addr]
}

func (l *countingListener) target(addr string) string {
	return net.JoinHostPort(addr, fmt.Sprint(l.port))
}

// publicAddrs puts two addresses the pod firewall counts as public
// (TEST-NET-3, 203.0.113.0/24, in no blocked range) on the node's
// loopback, as single /32s (as the test cluster puts its node IP there):
// a pod reaches them through its gateway, the node, like internet hosts,
// and nothing leaves the machine.
func publicAddrs(t *testing.T) (a, b string) {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs the ip command")
	}
	tag := make([]byte, 1)
	_, _ = rand.Read(tag)
	last := 20 + 2*(int(tag[0])%100)
	a, b = fmt.Sprintf("203.0.113.%d", last), fmt.Sprintf("203.0.113.%d", last+1)
	for _, addr := range []string{a, b} {
		if out, err := exec.Command("ip", "addr", "add", addr+"/32", "dev", "lo").CombinedOutput(); err != nil {
			t.Fatalf("ip addr add %s/32 dev lo: %v: %s", addr, err, out)
		}
		t.Cleanup(func() { _ = exec.Command("ip", "addr", "del", addr+"/32", "dev", "lo").Run() })
	}
	return a, b
}

// hostAddrs returns the node's IPv4 addresses but loopback and except.
func hostAddrs(t *testing.T, except ...string) []string {
	t.Helper()
	ifs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range ifs {
		if ip, ok := a.(*net.IPNet); ok && ip.IP.To4() != nil && !ip.IP.IsLoopback() && !slicesContains(except, ip.IP.String()) {
			out = append(out, ip.IP.String())
		}
	}
	return out
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// clusterTargets are the kubelet on each node and a neighbour box's agent
// (a pod of this driver), each answering the test.
func clusterTargets(t *testing.T, ctx context.Context, d runtime.Driver) []string {
	t.Helper()
	c := k8stest.Get(t)
	nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range nodes.Items {
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				out = append(out, net.JoinHostPort(a.Address, "10250"))
			}
		}
	}
	other := testsuite.Create(t, d, smallBox("neighbour"))
	var hd struct {
		IP string `json:"ip"`
	}
	if err := json.Unmarshal(other.Data, &hd); err != nil || net.ParseIP(hd.IP) == nil {
		t.Fatalf("neighbour handle %s: no pod ip (%v)", other.Data, err)
	}
	out = append(out, net.JoinHostPort(hd.IP, "7700"))
	for _, tg := range out {
		conn, err := net.DialTimeout("tcp", tg, 3*time.Second)
		if err != nil {
			t.Fatalf("cluster target %s does not answer the node: %v", tg, err)
		}
		conn.Close()
	}
	return out
}

func newModeDriver(t *testing.T, clusterCIDRs []netip.Prefix) runtime.Driver {
	t.Helper()
	c := k8stest.Get(t)
	ns := c.Namespace(t, "sbx-k8snet")
	img := c.AgentImage(t)
	c.EnsurePyImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := kubernetes.New(ctx, kubernetes.Config{
		Client: c.Client, Namespace: ns, AgentImage: img, PullPolicy: corev1.PullNever,
		ClusterCIDRs: clusterCIDRs, Logger: testLogger(),
	})
	if err != nil {
		t.Fatalf("kubernetes.New: %v", err)
	}
	return d
}

// attackModes runs reachPy in box against reach (must connect) and blocked
// (must not), tries to delete the firewall's table, and runs it again.
// reachPy's datagrams go to port 9 (discard): these tests count TCP only.
func attackModes(t *testing.T, d runtime.Driver, box runtime.Handle, reach, blocked []string) {
	t.Helper()
	check := func(when string) {
		t.Helper()
		r := testsuite.MustExec(t, d, box, append(append([]string{"/usr/bin/python3", "-c", reachPy, "9"}, reach...), blocked...)...)
		t.Logf("%s:\n%s%s", when, r.Stdout, r.Stderr)
		if !strings.Contains(r.Stdout, "loopback ok") {
			t.Errorf("%s: loopback in the box: got %q, want it working", when, r.Stdout)
		}
		for _, tg := range reach {
			if !strings.Contains(r.Stdout, "reached "+tg+"\n") {
				t.Errorf("%s: connecting to %s: not reached, want it reached", when, tg)
			}
		}
		for _, tg := range blocked {
			if !strings.Contains(r.Stdout, "blocked "+tg+" ") {
				t.Errorf("%s: connecting to %s: not blocked, want it blocked", when, tg)
			}
		}
	}
	check("before the flush attempt")
	r := testsuite.MustExec(t, d, box, "/usr/bin/python3", "-c", unfirewallPy)
	if !strings.Contains(r.Stdout, "nft errno 1\n") {
		t.Errorf("box root deleting table inet sbx_pod: got %q %q, want nft errno 1 (EPERM)", r.Stdout, r.Stderr)
	}
	check("after the flush attempt")
}

// TestNetworkPublicAttack: root in a box in mode public, on the test
// cluster's bridge CNI (no NetworkPolicy enforcement: the pod firewall is
// what holds), reaches an address that counts as public (on the node, so
// the node's listener counts it), but not a public address in its
// deny_cidrs, nor any other address of the node (listed as the cluster's
// as an operator would: --k8s-cluster-cidrs), the kubelet, or a neighbour
// box's agent; deleting the firewall's table fails with EPERM and changes
// nothing. The listener counts exactly the two allowed connections.
func TestNetworkPublicAttack(t *testing.T) {
	k8stest.Get(t)
	pubA, pubB := publicAddrs(t)
	l := listenCounting(t)
	host := hostAddrs(t, pubA, pubB)
	var cluster []netip.Prefix
	for _, a := range host {
		cluster = append(cluster, netip.PrefixFrom(netip.MustParseAddr(a), 32))
	}
	cluster = append(cluster, netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("10.244.0.0/16"))
	d := newModeDriver(t, cluster)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	blocked := clusterTargets(t, ctx, d)
	for _, a := range host {
		blocked = append(blocked, l.target(a))
	}
	blocked = append(blocked, l.target(pubB))
	spec := smallBox("public")
	spec.Network = &runtime.Network{Pod: &runtime.PodNetwork{Mode: runtime.PodPublic, Deny: []netip.Prefix{netip.MustParsePrefix(pubB + "/32")}}}
	box := testsuite.Create(t, d, spec)
	attackModes(t, d, box, []string{l.target(pubA)}, blocked)
	for _, a := range append(host, pubB) {
		if n := l.count(a); n != 0 {
			t.Errorf("host listener at %s: %d connections from the box, want none", a, n)
		}
	}
	if n := l.count(pubA); n != 2 {
		t.Errorf("host listener at the public address %s: %d connections, want 2 (one per attempt)", pubA, n)
	}
}

// TestNetworkAllowAttack: root in a box in mode allow whose allow-list
// names one public address and the cluster's own node and pod networks
// (10.200.0.0/16, 10.244.0.0/16), with no cluster ranges configured,
// reaches the allowed public address only: not a second public address
// outside the list, and not the node (its InternalIP from the downward
// API), the pod network's gateway, the kubelet or a neighbour's agent,
// which the pod firewall finds itself and never opens, whatever the
// allow-list says. Deleting the table fails with EPERM.
func TestNetworkAllowAttack(t *testing.T) {
	k8stest.Get(t)
	pubA, pubB := publicAddrs(t)
	l := listenCounting(t)
	d := newModeDriver(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	blocked := clusterTargets(t, ctx, d)
	nodeIP := strings.Split(blocked[0], ":")[0]
	blocked = append(blocked, l.target(pubB), l.target(nodeIP), l.target("10.244.0.1"))
	spec := smallBox("allow")
	spec.Network = &runtime.Network{Pod: &runtime.PodNetwork{Mode: runtime.PodAllow, Allow: []netip.Prefix{
		netip.MustParsePrefix(pubA + "/32"), netip.MustParsePrefix("10.200.0.0/16"), netip.MustParsePrefix("10.244.0.0/16"),
	}}}
	box := testsuite.Create(t, d, spec)
	attackModes(t, d, box, []string{l.target(pubA)}, blocked)
	for _, a := range []string{pubB, nodeIP, "10.244.0.1"} {
		if n := l.count(a); n != 0 {
			t.Errorf("host listener at %s: %d connections from the box, want none", a, n)
		}
	}
	if n := l.count(pubA); n != 2 {
		t.Errorf("host listener at the allowed address %s: %d connections, want 2 (one per attempt)", pubA, n)
	}
}

// TestBoxNetworkPolicyObject: the API server takes a connected box's own
// NetworkPolicy (its ipBlocks and excepts pass validation; the driver
// would only log a refusal), selecting that box's pod alone and owned by
// it, and Destroy removes it.
func TestBoxNetworkPolicyObject(t *testing.T) {
	c := k8stest.Get(t)
	d := newModeDriver(t, []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spec := smallBox("polpublic")
	spec.Network = &runtime.Network{Pod: &runtime.PodNetwork{Mode: runtime.PodPublic,
		Allow: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}, Deny: []netip.Prefix{netip.MustParsePrefix("10.1.2.0/24")}}}
	box := testsuite.Create(t, d, spec)
	var hd struct {
		NS  string `json:"ns"`
		Pod string `json:"pod"`
		UID string `json:"uid"`
	}
	if err := json.Unmarshal(box.Data, &hd); err != nil {
		t.Fatal(err)
	}
	api := c.Client.NetworkingV1().NetworkPolicies(hd.NS)
	p, err := api.Get(ctx, "sbx-"+spec.ID+"-egress", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the box's network policy: %v", err)
	}
	if got := p.Spec.PodSelector.MatchLabels["sbx.dev/id"]; got != spec.ID {
		t.Errorf("policy selects box %q, want %q", got, spec.ID)
	}
	if o := p.OwnerReferences; len(o) != 1 || string(o[0].UID) != hd.UID {
		t.Errorf("policy owners %+v, want the pod %s (uid %s)", o, hd.Pod, hd.UID)
	}
	var blocks []string
	for _, e := range p.Spec.Egress {
		for _, to := range e.To {
			blocks = append(blocks, to.IPBlock.CIDR)
		}
	}
	if got := strings.Join(blocks, " "); got != "0.0.0.0/0 10.1.0.0/16 0.0.0.0/0" {
		t.Errorf("egress ipBlocks %q, want the internet, the allowed range and DNS", got)
	}
	if err := d.Destroy(ctx, box); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Get(ctx, p.Name, metav1.GetOptions{}); err == nil {
		t.Errorf("network policy %s after Destroy: still there, want it gone", p.Name)
	}
}
