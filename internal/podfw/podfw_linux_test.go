package podfw

import (
	"fmt"
	"net"
	"os"
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
