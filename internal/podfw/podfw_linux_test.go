package podfw

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// TestApplyInNetns programs the firewall in a fresh network namespace and
// reads it back: table inet sbx_pod with input and output chains that drop
// by default, and loopback still carries TCP.
func TestApplyInNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	type result struct {
		chains map[string]nftables.ChainPolicy
		rules  int
		err    error
	}
	done := make(chan result, 1)
	go func() {
		// The thread ends in the new netns and is never unlocked, so it
		// exits with this goroutine.
		runtime.LockOSThread()
		ns, err := netns.New()
		if err != nil {
			done <- result{err: fmt.Errorf("new netns: %w", err)}
			return
		}
		defer ns.Close()
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			done <- result{err: fmt.Errorf("lo up: %w", err)}
			return
		}
		if err := Apply(Rules{Backend: BackendNFTables, Mode: ModeNone, AgentPorts: []uint16{7700, 7701}}); err != nil {
			done <- result{err: err}
			return
		}
		if err := Apply(Rules{Backend: BackendNFTables, Mode: ModeNone, AgentPorts: []uint16{7700, 7701}}); err != nil {
			done <- result{err: fmt.Errorf("applying again: %w", err)}
			return
		}
		c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
		if err != nil {
			done <- result{err: err}
			return
		}
		r := result{chains: map[string]nftables.ChainPolicy{}}
		chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
		if err != nil {
			done <- result{err: err}
			return
		}
		t := &nftables.Table{Family: nftables.TableFamilyINet, Name: Table}
		for _, ch := range chains {
			if ch.Table.Name == Table && ch.Policy != nil {
				r.chains[ch.Name] = *ch.Policy
				rules, err := c.GetRules(t, ch)
				if err != nil {
					done <- result{err: err}
					return
				}
				r.rules += len(rules)
			}
		}
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			done <- result{err: err}
			return
		}
		defer ln.Close()
		conn, err := net.DialTimeout("tcp4", ln.Addr().String(), 3*time.Second)
		if err != nil {
			done <- result{err: fmt.Errorf("loopback behind the firewall: %w", err)}
			return
		}
		conn.Close()
		done <- r
	}()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	for _, name := range []string{"input", "output"} {
		if p, ok := r.chains[name]; !ok || p != nftables.ChainPolicyDrop {
			t.Errorf("chain %s: got policy %v (present %v), want drop", name, p, ok)
		}
	}
	// lo, neighbour discovery (each way), related (in), and per port one
	// in and one out; applying twice must not double them.
	if want := 2 + 2 + 1 + 2*2; r.rules != want {
		t.Errorf("rules in table %s: got %d, want %d", Table, r.rules, want)
	}
}

func TestGateways(t *testing.T) {
	table := "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n" +
		"eth0\t00000000\t0100F40A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n" +
		"eth0\t0000F40A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
	got := gateways([]byte(table))
	if want := []netip.Addr{netip.MustParseAddr("10.244.0.1")}; !reflect.DeepEqual(got, want) {
		t.Errorf("gateways: got %v, want %v", got, want)
	}
}

// TestApplyLowersEveryRule: every rule a connected mode lists lowers to
// nftables and the kernel takes them, more than one batch's worth.
func TestApplyLowersEveryRule(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	r := Rules{Mode: ModePublic, AgentPorts: []uint16{7700}, DNS: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Blocked: prefixes("10.0.0.0/8", "240.0.0.0/4")}
	for i := range 600 {
		r.Deny = append(r.Deny, netip.PrefixFrom(netip.AddrFrom4([4]byte{203, 0, byte(i >> 8), byte(i)}), 32))
	}
	done := make(chan error, 1)
	var got int
	go func() {
		runtime.LockOSThread()
		ns, err := netns.New()
		if err != nil {
			done <- err
			return
		}
		defer ns.Close()
		if err := apply(r.NFTList()); err != nil {
			done <- err
			return
		}
		c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
		if err != nil {
			done <- err
			return
		}
		tb := &nftables.Table{Family: nftables.TableFamilyINet, Name: Table}
		for _, ch := range []string{ChainInput, ChainOutput} {
			rules, err := c.GetRules(tb, &nftables.Chain{Name: ch, Table: tb})
			if err != nil {
				done <- err
				return
			}
			got += len(rules)
		}
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if want := len(r.NFTList()); got != want {
		t.Errorf("rules in the kernel: got %d, want %d", got, want)
	}
}

// TestPublicDNSInNetns: in mode public the firewall lets UDP and TCP 53
// through to a nameserver in a blocked range and nothing else to it (TCP
// 80 there is dropped), on a real kernel: a "pod" namespace with a veth to
// a "node" namespace serving both ports.
func TestPublicDNSInNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	type result struct {
		tcp53, tcp80, udp53 error
		err                 error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		fail := func(err error) { done <- result{err: err} }
		node, err := netns.New()
		if err != nil {
			fail(err)
			return
		}
		defer node.Close()
		pod, err := netns.New()
		if err != nil {
			fail(err)
			return
		}
		defer pod.Close()
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "pod0"}, PeerName: "node0"}
		if err := netlink.LinkAdd(veth); err != nil {
			fail(fmt.Errorf("veth: %w", err))
			return
		}
		peer, err := netlink.LinkByName("node0")
		if err == nil {
			err = netlink.LinkSetNsFd(peer, int(node))
		}
		if err != nil {
			fail(fmt.Errorf("moving the peer: %w", err))
			return
		}
		up := func(name, addr string) error {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if addr != "" {
				a, _ := netlink.ParseAddr(addr)
				if err := netlink.AddrAdd(l, a); err != nil {
					return err
				}
			}
			return netlink.LinkSetUp(l)
		}
		if err := errors.Join(up("lo", ""), up("pod0", "10.99.0.2/24")); err != nil {
			fail(err)
			return
		}
		if err := netns.Set(node); err != nil {
			fail(err)
			return
		}
		if err := errors.Join(up("lo", ""), up("node0", "10.99.0.1/24")); err != nil {
			fail(err)
			return
		}
		for _, p := range []string{"53", "80"} {
			ln, err := net.Listen("tcp4", "10.99.0.1:"+p)
			if err != nil {
				fail(err)
				return
			}
			defer ln.Close()
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					c.Close()
				}
			}()
		}
		udp, err := net.ListenPacket("udp4", "10.99.0.1:53")
		if err != nil {
			fail(err)
			return
		}
		defer udp.Close()
		go func() {
			buf := make([]byte, 512)
			for {
				n, from, err := udp.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = udp.WriteTo(buf[:n], from)
			}
		}()
		if err := netns.Set(pod); err != nil {
			fail(err)
			return
		}
		// The kernel reports a veth's carrier asynchronously (linkwatch,
		// up to a second): wait until the pod's end is up.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			l, err := netlink.LinkByName("pod0")
			if err == nil && l.Attrs().OperState == netlink.OperUp {
				break
			}
			if time.Now().After(deadline) {
				fail(fmt.Errorf("pod0 not up after 5 s: %v", err))
				return
			}
		}
		r := Rules{Mode: ModePublic, DNS: []netip.Addr{netip.MustParseAddr("10.99.0.1")}, Blocked: prefixes("10.0.0.0/8")}
		if err := apply(r.NFTList()); err != nil {
			fail(err)
			return
		}
		dial := func(network, addr string) error {
			c, err := net.DialTimeout(network, addr, 3*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			if network == "udp4" {
				_ = c.SetDeadline(time.Now().Add(3 * time.Second))
				if _, err := c.Write([]byte("q")); err != nil {
					return err
				}
				_, err = c.Read(make([]byte, 8))
				return err
			}
			return nil
		}
		done <- result{tcp53: dial("tcp4", "10.99.0.1:53"), tcp80: dial("tcp4", "10.99.0.1:80"), udp53: dial("udp4", "10.99.0.1:53")}
	}()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.tcp53 != nil || r.udp53 != nil {
		t.Errorf("DNS to the nameserver: tcp %v, udp %v; want both through", r.tcp53, r.udp53)
	}
	if r.tcp80 == nil {
		t.Errorf("TCP 80 to the nameserver (in a blocked range): connected, want it dropped")
	}
}

// TestApplyLargestPolicy: the largest policy the API lets through (1024
// allow and 1024 deny CIDRs) with the blocked and cluster ranges programs
// in a bounded time.
func TestApplyLargestPolicy(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	r := Rules{Mode: ModePublic, AgentPorts: []uint16{7700, 7701}, Blocked: prefixes("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"),
		Never: prefixes("10.96.0.0/12", "10.244.0.0/16")}
	for i := range 1024 {
		r.Allow = append(r.Allow, netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), 32))
		r.Deny = append(r.Deny, netip.PrefixFrom(netip.AddrFrom4([4]byte{203, 0, byte(i >> 8), byte(i)}), 32))
	}
	done := make(chan error, 1)
	var took time.Duration
	go func() {
		runtime.LockOSThread()
		ns, err := netns.New()
		if err != nil {
			done <- err
			return
		}
		defer ns.Close()
		t0 := time.Now()
		err = apply(r.NFTList())
		took = time.Since(t0)
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d rules programmed in %v", len(r.NFTList()), took)
	if took > 10*time.Second {
		t.Errorf("programming %d rules took %v, want under 10 s", len(r.NFTList()), took)
	}
}

// TestApplyIPTablesInNetns programs the iptables backend on this host's
// kernel (Linux implements the same x_tables ABI as gVisor's netstack) in a
// fresh network namespace, twice (the second replaces the first), and has
// iptables-legacy-save, where installed, print what the kernel holds: the
// tool's reading of the table must be exactly ModeNone's rules.
func TestApplyIPTablesInNetns(t *testing.T) {
	save := inNetns(t, func() error {
		for i := range 2 {
			if err := Apply(Rules{Backend: BackendIPTables, Mode: ModeNone, AgentPorts: []uint16{7700, 7701}}); err != nil {
				return fmt.Errorf("apply %d: %w", i+1, err)
			}
		}
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer ln.Close()
		conn, err := net.DialTimeout("tcp4", ln.Addr().String(), 3*time.Second)
		if err != nil {
			return fmt.Errorf("loopback behind the firewall: %w", err)
		}
		return conn.Close()
	})
	rules := []string{
		"-A INPUT -i lo -j ACCEPT",
		"-A INPUT -p tcp -m tcp --dport 7700 -j ACCEPT",
		"-A INPUT -p tcp -m tcp --dport 7701 -j ACCEPT",
		"-A OUTPUT -o lo -j ACCEPT",
		"-A OUTPUT -p tcp -m tcp --sport 7700 --tcp-flags ACK ACK -j ACCEPT",
		"-A OUTPUT -p tcp -m tcp --sport 7701 --tcp-flags ACK ACK -j ACCEPT",
	}
	checkSave(t, save, map[string][]string{"iptables-legacy-save": rules, "ip6tables-legacy-save": rules}, "DROP")
}

// TestIPTablesLowering: the generic rules other modes need (remote
// prefixes of either family, UDP, remote ports, drop verdicts, an accept
// policy) are what iptables reads back from the kernel.
func TestIPTablesLowering(t *testing.T) {
	rules := []Rule{
		{Dir: Out, Proto: ProtoTCP, Remote: netip.MustParsePrefix("10.0.0.0/8"), Verdict: Drop},
		{Dir: Out, Proto: ProtoUDP, Remote: netip.MustParsePrefix("192.0.2.53/32"), RemotePort: 53, Verdict: Accept},
		{Dir: In, Proto: ProtoTCP, Remote: netip.MustParsePrefix("fd00::/8"), RemotePort: 443, Established: true, Verdict: Accept},
		{Dir: In, Proto: ProtoUDP, LocalPort: 5353, Verdict: Drop},
	}
	save := inNetns(t, func() error { return applyIPTables(rules, Accept) })
	checkSave(t, save, map[string][]string{
		"iptables-legacy-save": {
			"-A INPUT -p udp -m udp --dport 5353 -j DROP",
			"-A OUTPUT -d 10.0.0.0/8 -p tcp -j DROP",
			"-A OUTPUT -d 192.0.2.53/32 -p udp -m udp --dport 53 -j ACCEPT",
		},
		"ip6tables-legacy-save": {
			"-A INPUT -s fd00::/8 -p tcp -m tcp --sport 443 --tcp-flags ACK ACK -j ACCEPT",
			"-A INPUT -p udp -m udp --dport 5353 -j DROP",
		},
	}, "ACCEPT")
}

// inNetns runs fn in a fresh network namespace (lo up), then
// {ip,ip6}tables-legacy-save -t filter there (the tools found), and
// returns their output by tool.
func inNetns(t *testing.T, fn func() error) map[string]string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	type result struct {
		save map[string]string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies in the netns
		ns, err := netns.New()
		if err != nil {
			done <- result{err: fmt.Errorf("new netns: %w", err)}
			return
		}
		defer ns.Close()
		if lo, err := netlink.LinkByName("lo"); err != nil || netlink.LinkSetUp(lo) != nil {
			done <- result{err: fmt.Errorf("lo up: %v", err)}
			return
		}
		if err := fn(); err != nil {
			done <- result{err: err}
			return
		}
		r := result{save: map[string]string{}}
		for _, tool := range []string{"iptables-legacy-save", "ip6tables-legacy-save"} {
			if _, err := exec.LookPath(tool); err != nil {
				continue
			}
			// A child started from this locked thread is in its netns.
			out, err := exec.Command(tool, "-t", "filter").CombinedOutput()
			if err != nil {
				done <- result{err: fmt.Errorf("%s: %v: %s", tool, err, out)}
				return
			}
			r.save[tool] = string(out)
		}
		done <- r
	}()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.save
}

// checkSave compares each tool's rules and chain policies (INPUT and OUTPUT
// policy, FORWARD DROP) with want.
func checkSave(t *testing.T, save map[string]string, want map[string][]string, policy string) {
	t.Helper()
	if len(save) == 0 {
		t.Log("no iptables-legacy-save: the tables were checked by reading them back only")
	}
	for tool, out := range save {
		var got []string
		for _, l := range strings.Split(out, "\n") {
			switch {
			case strings.HasPrefix(l, "-A"):
				got = append(got, l)
			case strings.HasPrefix(l, ":"):
				got = append(got, strings.Join(strings.Fields(l)[:2], " ")) // without the counters
			}
		}
		w := append([]string{":INPUT " + policy, ":FORWARD DROP", ":OUTPUT " + policy}, want[tool]...)
		if strings.Join(got, "\n") != strings.Join(w, "\n") {
			t.Errorf("%s:\ngot\n%s\nwant\n%s", tool, strings.Join(got, "\n"), strings.Join(w, "\n"))
		}
	}
}
