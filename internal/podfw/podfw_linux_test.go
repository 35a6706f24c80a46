package podfw

import (
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
