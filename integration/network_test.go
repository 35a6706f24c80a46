package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/testutil"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// netDaemon is a daemon with networking on, over a bridge, subnet and table
// of its own, forwarding DNS to the test internet.
type netDaemon struct {
	*daemon
	bridge, table, gateway string
	inet                   *testInternet
	// tlsConns counts open connections at the test internet's HTTPS
	// servers, by address (startEgressDaemon).
	tlsConns map[string]*atomic.Int32
}

func startNetDaemon(t *testing.T, extraArgs ...string) *netDaemon {
	t.Helper()
	testutil.RequiresRoot(t)
	inet := newTestInternet(t)
	tag := randTag()
	b := make([]byte, 1)
	_, _ = fmt.Sscanf(tag[:2], "%02x", &b[0])
	nd := &netDaemon{bridge: "sbxe" + tag, table: "sbxe" + tag, inet: inet,
		gateway: fmt.Sprintf("10.215.%d.1", b[0])}
	t.Cleanup(func() { removeNetworking(nd.bridge, nd.table) }) // runs after the daemon stops
	nd.daemon = startDaemon(t, append([]string{"--network=true", "--net-bridge", nd.bridge, "--net-table", nd.table,
		"--net-subnet", fmt.Sprintf("10.215.%d.0/24", b[0]), "--dns-upstream", inet.dns, "--net-pool", "2"}, extraArgs...)...)
	return nd
}

// reach reports whether the box fetches http://addr/ (2 s timeout).
func reach(t *testing.T, ctx context.Context, sb *sbx.Sandbox, addr string) bool {
	t.Helper()
	res, err := sb.RunShell(ctx, "curl -sSf --max-time 2 -o /dev/null http://"+addr+"/")
	if err != nil {
		t.Fatalf("curl %s: %v", addr, err)
	}
	return res.Code == 0
}

// resolve returns the IPv4 address the box resolves name to ("" if none).
func resolve(t *testing.T, ctx context.Context, sb *sbx.Sandbox, name string) string {
	t.Helper()
	res, err := sb.RunShell(ctx, "getent ahostsv4 "+name+" | head -n1")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(res.Stdout))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

func createNet(t *testing.T, ctx context.Context, d *netDaemon, p *sbx.NetworkPolicy, cmd ...string) *sbx.Sandbox {
	t.Helper()
	sb, err := d.client().Create(ctx, sbx.CreateOptions{Network: p, Command: cmd})
	if err != nil {
		t.Fatalf("create with %+v: %v", p, err)
	}
	d.remember(sb.ID)
	return sb
}

type netState struct {
	Slots []struct {
		Name, Owner, Veth, IP string
	} `json:"slots"`
}

func (d *netDaemon) state(t *testing.T) netState {
	t.Helper()
	var st netState
	b, err := os.ReadFile(filepath.Join(d.dataDir, "network", "state.json"))
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestNetworkPolicies(t *testing.T) {
	d := startNetDaemon(t)
	ctx := ctxT(t, 5*time.Minute)
	in := d.inet

	// Host services the boxes must not reach: one on the bridge address, one
	// on another host address.
	for _, a := range []string{d.gateway, in.hostAddr} {
		ln, err := net.Listen("tcp", a+":8081")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		// It reads the request before answering: a server that closes with
		// the request unread resets the connection, and curl may then fail
		// even though the service was reached.
		go func() { _ = http.Serve(ln, echoHandler("the host")) }()
	}

	pub := createNet(t, ctx, d, nil)
	other := createNet(t, ctx, d, nil, "python3", "-m", "http.server", "8000")
	if pub.Info.GetNetwork().GetMode() != sbxv1.NetworkMode_NETWORK_MODE_PUBLIC || pub.Info.GetIpAddress() == "" {
		t.Fatalf("default network: %v %q, want public with an address", pub.Info.GetNetwork(), pub.Info.GetIpAddress())
	}

	t.Run("public", func(t *testing.T) {
		if !reach(t, ctx, pub, in.public) {
			t.Errorf("public box cannot reach %s", in.public)
		}
		if got := resolve(t, ctx, pub, "public.test"); got != in.public {
			t.Errorf("public.test resolves to %q, want %s", got, in.public)
		}
		if got := mustRun(t, ctx, pub, "cat /etc/resolv.conf"); got != "nameserver "+d.gateway+"\n" {
			t.Errorf("resolv.conf = %q", got)
		}
		for _, a := range []string{in.private, in.cgnat, in.metadata, d.gateway + ":8081", in.hostAddr + ":8081",
			d.gateway + ":" + strings.Split(d.addr, ":")[1]} {
			if reach(t, ctx, pub, a) {
				t.Errorf("public box reaches %s", a)
			}
		}
		// The sandbox next door serves (it answers itself) but not us.
		deadline := time.Now().Add(20 * time.Second)
		for !reach(t, ctx, other, "127.0.0.1:8000") && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
		if !reach(t, ctx, other, "127.0.0.1:8000") {
			t.Fatal("the second sandbox's server did not come up")
		}
		if reach(t, ctx, pub, other.Info.GetIpAddress()+":8000") {
			t.Error("one sandbox reaches another")
		}
		// Root in the box cannot reconfigure its network.
		for _, cmd := range []string{"ip link set eth0 down", "ip addr add 10.215.0.99/24 dev eth0", "ip route del default"} {
			if res, err := pub.RunShell(ctx, cmd); err != nil || res.Code == 0 {
				t.Errorf("%q in the box: err %v, exit %d; want a failure", cmd, err, res.Code)
			}
		}
		if !reach(t, ctx, pub, in.public) {
			t.Error("lost connectivity after the reconfiguration attempts")
		}
		if err := pub.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		if st := pub.Info.GetStats(); st.GetNetTxBytes() == 0 || st.GetNetRxBytes() == 0 {
			t.Errorf("stats %v: want traffic counted", st)
		}
	})

	t.Run("none", func(t *testing.T) {
		sb := createNet(t, ctx, d, &sbx.NetworkPolicy{Mode: "none"})
		if sb.Info.GetIpAddress() != "" {
			t.Errorf("none box has address %q", sb.Info.GetIpAddress())
		}
		if got := mustRun(t, ctx, sb, "ls /sys/class/net | tr '\\n' ' '"); got != "lo " {
			t.Errorf("interfaces of a none box: %q, want lo only", got)
		}
		for _, a := range []string{in.public, d.gateway + ":8081"} {
			if reach(t, ctx, sb, a) {
				t.Errorf("none box reaches %s", a)
			}
		}
	})

	t.Run("allow-cidr", func(t *testing.T) {
		sb := createNet(t, ctx, d, &sbx.NetworkPolicy{Mode: "allow", AllowCIDRs: []string{in.public + "/32"}})
		if !reach(t, ctx, sb, in.public) {
			t.Errorf("cannot reach the allowed %s", in.public)
		}
		for _, a := range []string{in.allowed, in.blocked, in.private, in.metadata, d.gateway + ":8081"} {
			if reach(t, ctx, sb, a) {
				t.Errorf("allow-cidr box reaches %s", a)
			}
		}
	})

	t.Run("allow-domains", func(t *testing.T) {
		sb := createNet(t, ctx, d, &sbx.NetworkPolicy{Mode: "allow", AllowDomains: []string{"*.allowed.test"}})
		if got := resolve(t, ctx, sb, "a.allowed.test"); got != in.allowed {
			t.Errorf("a.allowed.test resolves to %q, want %s", got, in.allowed)
		}
		if !reach(t, ctx, sb, "a.allowed.test") {
			t.Error("cannot reach a.allowed.test")
		}
		if got := resolve(t, ctx, sb, "blocked.test"); got != "" {
			t.Errorf("blocked.test resolves to %q", got)
		}
		for _, a := range []string{in.blocked, in.public} {
			if reach(t, ctx, sb, a) {
				t.Errorf("allow-domains box reaches %s by address", a)
			}
		}
	})

	t.Run("update", func(t *testing.T) {
		sb := createNet(t, ctx, d, nil)
		if err := sb.UpdateNetwork(ctx, sbx.NetworkPolicy{Mode: "none"}); err != nil {
			t.Fatal(err)
		}
		if sb.Info.GetIpAddress() != "" || reach(t, ctx, sb, in.public) {
			t.Errorf("after switching to none: address %q, or still reaches %s", sb.Info.GetIpAddress(), in.public)
		}
		if _, _, code := d.cli("", "network", sb.ID, "--mode", "public"); code != 0 {
			t.Fatal("sbx network --mode public failed")
		}
		if !reach(t, ctx, sb, in.public) {
			t.Error("cannot reach the internet after switching back to public")
		}
	})

	t.Run("validation", func(t *testing.T) {
		for _, tc := range []struct {
			p    sbx.NetworkPolicy
			want string
		}{
			{sbx.NetworkPolicy{Mode: "allow", AllowCIDRs: []string{"10.0.0.0/33"}}, "10.0.0.0/33"},
			{sbx.NetworkPolicy{Mode: "allow", AllowDomains: []string{"bad..name"}}, "bad..name"},
			{sbx.NetworkPolicy{Mode: "none", AllowCIDRs: []string{"1.2.3.4/32"}}, "none"},
		} {
			_, err := d.client().Create(ctx, sbx.CreateOptions{Network: &tc.p})
			if !sbx.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("create with %+v: got %v, want invalid argument naming %q", tc.p, err, tc.want)
			}
		}
	})

	t.Run("destroy leaves nothing", func(t *testing.T) {
		sb := createNet(t, ctx, d, &sbx.NetworkPolicy{Mode: "allow", AllowDomains: []string{"*.allowed.test"}})
		var name, veth, ip string
		for _, s := range d.state(t).Slots {
			if s.Owner == sb.ID {
				name, veth, ip = s.Name, s.Veth, s.IP
			}
		}
		if name == "" || !linkExists(veth) || len(nftElementsOf(t, d.table, ip)) == 0 {
			t.Fatalf("slot %q veth %q address %q: not set up", name, veth, ip)
		}
		if err := sb.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
		d.waitNetGone(t, sb.ID, name, veth, ip)
	})
}

// waitNetGone waits for a destroyed sandbox's veth, namespace, rules and
// address to be gone (veths are deleted in the background).
func (d *netDaemon) waitNetGone(t *testing.T, id, slot, veth, ip string) {
	t.Helper()
	var left []string
	for range 100 {
		left = nil
		if linkExists(veth) {
			left = append(left, "veth "+veth)
		}
		if _, err := os.Stat(filepath.Join(d.dataDir, "network", "ns", slot)); err == nil {
			left = append(left, "netns "+slot)
		}
		if els := nftElementsOf(t, d.table, ip); len(els) != 0 {
			left = append(left, fmt.Sprintf("nft elements %v", els))
		}
		for _, s := range d.state(t).Slots {
			if s.Owner == id {
				left = append(left, "IPAM entry "+s.IP)
			}
		}
		if len(left) == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("left behind by %s: %v", id, left)
}

func TestNetworkSurvivesDaemonCrash(t *testing.T) {
	d := startNetDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	sb := createNet(t, ctx, d, nil)
	if !reach(t, ctx, sb, d.inet.public) {
		t.Fatal("cannot reach the internet before the crash")
	}
	// The pool holds slots with no owner: leftovers after a crash.
	time.Sleep(500 * time.Millisecond)
	d.kill9()
	d.start()
	sb, err := d.client().Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !reach(t, ctx, sb, d.inet.public) || resolve(t, ctx, sb, "public.test") != d.inet.public {
		res, _ := sb.RunShell(ctx, "curl -sS --max-time 2 http://"+d.inet.public+"/; getent ahostsv4 public.test; cat /etc/resolv.conf; ip -4 addr; ip route")
		dbg, _ := exec.Command("sh", "-c", "bridge link; ip -br addr show "+d.bridge+"; nft list table inet "+d.table+" | head -30; cat /proc/sys/net/ipv4/ip_forward; ip route get "+d.inet.public).CombinedOutput()
		t.Errorf("the surviving sandbox lost its network: %s %s\n%s", res.Stdout, res.Stderr, dbg)
	}
	if reach(t, ctx, sb, d.inet.private) {
		t.Error("the surviving sandbox lost its firewall rules")
	}
	time.Sleep(time.Second) // let the new pool fill
	// Every slot on disk is the survivor's or a fresh pool slot whose
	// namespace exists; every sbx veth on the bridge is a slot's.
	st := d.state(t)
	veths := map[string]bool{}
	for _, s := range st.Slots {
		veths[s.Veth] = true
		if s.Owner != "" && s.Owner != sb.ID {
			t.Errorf("slot of %s survived the restart", s.Owner)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(d.dataDir, "network", "ns"))
	if len(ents) != len(st.Slots) {
		t.Errorf("%d namespaces for %d slots", len(ents), len(st.Slots))
	}
	ports, _ := filepath.Glob("/sys/class/net/" + d.bridge + "/brif/*")
	for _, p := range ports {
		if !veths[filepath.Base(p)] {
			t.Errorf("veth %s on the bridge belongs to no slot", filepath.Base(p))
		}
	}
}

// TestAllowCIDRNeverOpensHost: allow_cidrs that cover the gateway (or every
// address) must not open host services, in allow and public mode; only the
// DNS forwarder (and the egress proxy) stay reachable on the host.
func TestAllowCIDRNeverOpensHost(t *testing.T) {
	d := startNetDaemon(t)
	ctx := ctxT(t, 5*time.Minute)
	in := d.inet
	// A host service on every address (0.0.0.0), on a port that is neither
	// DNS nor an egress port.
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	// A real HTTP server: it reads the request before answering, so a
	// reachable service is never mistaken for a reset one.
	go func() { _ = http.Serve(ln, echoHandler("the host")) }()
	port := fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
	for _, tt := range []struct {
		name          string
		pol           sbx.NetworkPolicy
		name2resolve  string
		wantResolved  string
		reachableHole string // an address the allow_cidrs entry does open
	}{
		{"allow 10.0.0.0/8", sbx.NetworkPolicy{Mode: "allow", AllowCIDRs: []string{"10.0.0.0/8"}, AllowDomains: []string{"*.allowed.test"}},
			"a.allowed.test", in.allowed, in.private},
		{"allow 0.0.0.0/0", sbx.NetworkPolicy{Mode: "allow", AllowCIDRs: []string{"0.0.0.0/0"}, AllowDomains: []string{"*.allowed.test"}},
			"a.allowed.test", in.allowed, in.private},
		{"public 0.0.0.0/0", sbx.NetworkPolicy{Mode: "public", AllowCIDRs: []string{"0.0.0.0/0"}},
			"public.test", in.public, in.private},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sb := createNet(t, ctx, d, &tt.pol)
			// The box's network works (so a failure below is the policy's):
			// DNS through the forwarder on the gateway, and what the entry
			// is for.
			if got := resolve(t, ctx, sb, tt.name2resolve); got != tt.wantResolved {
				t.Errorf("%s resolves to %q through the forwarder, want %s", tt.name2resolve, got, tt.wantResolved)
			}
			if !reach(t, ctx, sb, tt.reachableHole) {
				t.Fatalf("box with %v cannot reach %s, which the entry covers", tt.pol.AllowCIDRs, tt.reachableHole)
			}
			for _, a := range []string{d.gateway, in.hostAddr} {
				if reach(t, ctx, sb, a+":"+port) {
					t.Errorf("box with %v reaches the host service at %s:%s", tt.pol.AllowCIDRs, a, port)
				}
			}
		})
	}
}
