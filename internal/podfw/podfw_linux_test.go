package podfw

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"reflect"
	"runtime"
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
		if err := Apply(Rules{Mode: ModeNone, AgentPorts: []uint16{7700, 7701}}); err != nil {
			done <- result{err: err}
			return
		}
		if err := Apply(Rules{Mode: ModeNone, AgentPorts: []uint16{7700, 7701}}); err != nil {
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
		if err := apply(r.List()); err != nil {
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
	if want := len(r.List()); got != want {
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
		if err := apply(r.List()); err != nil {
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
		err = apply(r.List())
		took = time.Since(t0)
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d rules programmed in %v", len(r.List()), took)
	if took > 10*time.Second {
		t.Errorf("programming %d rules took %v, want under 10 s", len(r.List()), took)
	}
}
