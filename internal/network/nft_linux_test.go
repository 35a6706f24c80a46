package network

import (
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sbxdev/sbx/internal/testutil"
)

// testFirewall is a firewall over a table of the test's own (no bridge:
// only the table is looked at), removed at the end.
func testFirewall(t *testing.T) *firewall {
	t.Helper()
	testutil.RequiresRoot(t)
	p := ruleParams{bridge: "sbxnone0", subnet: pfx("10.216.0.0/16"), gateway: netip.MustParseAddr("10.216.0.1"),
		egressPorts: []uint16{80, 443}, proxyPort: 3128, apiPort: 7779}
	f, err := newFirewall(fmt.Sprintf("sbxft%d", time.Now().UnixNano()%1e6), p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = f.remove()
		f.close()
	})
	return f
}

// scaleSlots returns n slots with addresses in 10.216/16, every sixth in
// allow mode with a few allow_cidrs, the others public (a third of them
// with deny_cidrs and API access).
func scaleSlots(n int) []*slot {
	var out []*slot
	for i := range n {
		ip := netip.AddrFrom4([4]byte{10, 216, byte((i + 2) >> 8), byte(i + 2)})
		pol := Policy{Mode: ModePublic}
		switch {
		case i%6 == 1:
			pol = Policy{Mode: ModeAllow, AllowDomains: []string{"*.allowed.test"},
				AllowCIDRs: []netip.Prefix{pfx("198.51.100.0/24"), pfx("198.51.100.7/32"), pfx("203.0.113.9/32")}}
		case i%3 == 0:
			pol.DenyCIDRs, pol.APIAccess = []netip.Prefix{pfx("8.8.8.8/32")}, true
		}
		out = append(out, &slot{Name: fmt.Sprintf("n%010x", i), Owner: fmt.Sprintf("sb-%d", i), IP: ip, Veth: "sbxv", Policy: pol})
	}
	return out
}

// TestFirewallAtScale: the table of 3000 boxes is built, changed and
// rebuilt in bounded batches. The first version put every box's chains
// and rules in one batch at start, and from 15 boxes on the kernel's
// answer overflowed the socket (ENOBUFS): the daemon never started again.
func TestFirewallAtScale(t *testing.T) {
	f := testFirewall(t)
	slots := scaleSlots(3000)
	start := time.Now()
	if err := f.rebuild(slots); err != nil {
		t.Fatalf("rebuild with %d boxes: %v", len(slots), err)
	}
	t.Logf("rebuild with %d boxes: %v", len(slots), time.Since(start))
	count := func(set string) int { return len(setElements(t, f.table.Name, set)) }
	wants := map[string]int{setBoxes: 3000, setPublic: 2500, setEgress: 500, setAPI: 1000, setDeny: 1000,
		setAllow: 1000} // 198.51.100.7/32 is inside 198.51.100.0/24
	for set, want := range wants {
		// Interval sets list a range as one element here.
		if got := count(set); got != want {
			t.Errorf("set %s: got %d elements, want %d", set, got, want)
		}
	}

	// Learned addresses of allow-mode boxes survive a rebuild (a daemon
	// restart); a public box's do not exist.
	allowBox := slots[1]
	if err := f.allowAddrs(allowBox.Name, []netip.Addr{netip.MustParseAddr("198.51.100.10")}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := f.rebuild(slots); err != nil {
		t.Fatal(err)
	}
	if els := learnedOf(t, f.table.Name, allowBox.IP); len(els) != 1 || els[0].Expires <= 0 || els[0].Expires > learnedMin {
		t.Errorf("learned of %s after a rebuild: %+v, want 198.51.100.10 with what was left of %v", allowBox.IP, els, learnedMin)
	}

	// A box with the largest policy there is: its change needs several
	// batches and comes out whole.
	big := &slot{Name: "nbig", Owner: "sb-big", IP: netip.MustParseAddr("10.216.200.2")}
	for i := range MaxPolicyEntries {
		big.Policy.AllowCIDRs = append(big.Policy.AllowCIDRs, netip.PrefixFrom(netip.AddrFrom4([4]byte{11, byte(i >> 8), byte(i), 0}), 24))
		big.Policy.DenyCIDRs = append(big.Policy.DenyCIDRs, netip.PrefixFrom(netip.AddrFrom4([4]byte{12, byte(i >> 8), byte(i), 0}), 24))
	}
	big.Policy.Mode = ModeAllow
	if err := f.addBox(big); err != nil {
		t.Fatalf("add a box with %d allow and deny entries: %v", MaxPolicyEntries, err)
	}
	for i := range big.Policy.AllowCIDRs {
		big.Policy.AllowCIDRs[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{13, byte(i >> 8), byte(i), 0}), 24)
	}
	if err := f.setPolicy(big); err != nil {
		t.Fatalf("swap a box's %d allow entries: %v", MaxPolicyEntries, err)
	}
	if got, want := count(setAllow), 1000+MaxPolicyEntries; got != want {
		t.Errorf("allow set after the swap: got %d elements, want %d", got, want)
	}
	if !inSet(t, f.table.Name, setBoxes, big.IP) {
		t.Errorf("box %s is out of the boxes set after its policy swap", big.IP)
	}

	// Boxes that are gone leave nothing.
	var names []string
	for _, sl := range slots {
		names = append(names, sl.Name)
	}
	if err := f.removeBoxes(append(names, big.Name)); err != nil {
		t.Fatal(err)
	}
	for set := range wants {
		if got := count(set); got != 0 {
			t.Errorf("set %s: %d elements left after removing every box", set, got)
		}
	}
	if got := count(setLearned); got != 0 {
		t.Errorf("learned: %d elements left after removing every box", got)
	}
}

// TestFirewallRanges: an interval element covers its whole range, ends
// included, and nothing beyond (checked with nft, when it is installed).
func TestFirewallRanges(t *testing.T) {
	f := testFirewall(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs the nft command")
	}
	sl := &slot{Name: "n1", Owner: "sb-1", IP: netip.MustParseAddr("10.216.0.2"),
		Policy: Policy{Mode: ModeAllow, AllowCIDRs: []netip.Prefix{pfx("198.51.100.0/24"), pfx("203.0.113.9/32")}}}
	if err := f.rebuild([]*slot{sl}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"198.51.100.0", true}, {"198.51.100.255", true}, {"198.51.101.0", false}, {"198.51.99.255", false},
		{"203.0.113.9", true}, {"203.0.113.10", false},
	} {
		err := exec.Command("nft", "get", "element", "inet", f.table.Name, setAllow, "{ 10.216.0.2 . "+tc.addr+" }").Run()
		if got := err == nil; got != tc.want {
			t.Errorf("10.216.0.2 . %s in the allow set: got %v, want %v", tc.addr, got, tc.want)
		}
	}
	out, _ := exec.Command("nft", "list", "set", "inet", f.table.Name, setAllow).CombinedOutput()
	if !strings.Contains(string(out), "198.51.100.0/24") {
		t.Errorf("allow set:\n%s\nwant 10.216.0.2 . 198.51.100.0/24", out)
	}
}
