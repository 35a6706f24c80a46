package integration

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/nftables"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// crashNet is the networking of a crash-loop daemon: a bridge, table and
// /24 of its own, so kills and restarts exercise network namespaces, veths,
// the firewall's set elements and address leases too.
type crashNet struct {
	bridge, table, subnet string
}

// crashName is a name the crash daemon's DNS upstream (the test internet)
// answers, inside allow-mode boxes' allowed domains: resolving it there
// puts elements in the firewall's learned set.
const crashName = "a.allowed.test"

// startCrashDaemon starts the crash tests' daemon with networking on, a
// pool of 2 namespaces (so pooled slots are killed mid-way too) and the
// test internet's DNS server upstream.
func startCrashDaemon(t *testing.T) (*daemon, *crashNet) {
	t.Helper()
	tag := randTag()
	var b byte
	_, _ = fmt.Sscanf(tag[:2], "%02x", &b)
	n := &crashNet{bridge: "sbxc" + tag, table: "sbxc" + tag, subnet: fmt.Sprintf("10.219.%d.0/24", b)}
	inet := newTestInternet(t)
	t.Cleanup(func() { removeNetworking(n.bridge, n.table) }) // runs after the daemon stops
	d := startDaemon(t, "--network=true", "--net-bridge", n.bridge, "--net-table", n.table, "--net-subnet", n.subnet,
		"--net-pool", "2", "--dns-upstream", inet.dns)
	return d, n
}

// crashPolicy picks a random network policy for a crash-loop box: the
// default (public), none, allow (CIDRs and domains: elements in the allow
// sets) or public with denied ranges (elements in the deny set).
func crashPolicy(rng *rand.Rand) *sbx.NetworkPolicy {
	switch rng.IntN(4) {
	case 0:
		return nil
	case 1:
		return &sbx.NetworkPolicy{Mode: "none"}
	case 2:
		return &sbx.NetworkPolicy{Mode: "allow", AllowCIDRs: []string{"192.0.2.0/24"}, AllowDomains: []string{"*.allowed.test"}}
	default:
		return &sbx.NetworkPolicy{Mode: "public", DenyCIDRs: []string{"198.51.100.0/24"}}
	}
}

// crashSlot is a network slot as the daemon's state file records it.
type crashSlot struct {
	Name, Owner, Veth, IP string
}

// netLeaks lists the networking left for sandboxes not in live: leases
// (slots) owned by others, namespace files and mounts no slot has, bridge
// ports no slot's veth is, and firewall set elements keyed by an address
// no live box leases. With stopped, the daemon has stopped gracefully and
// nothing at all may be left: no slot (the pool's are removed at stop),
// namespace, bridge port or set element.
func (n *crashNet) netLeaks(d *daemon, live []string, stopped bool) []string {
	if n == nil {
		return nil
	}
	keep := map[string]bool{}
	for _, id := range live {
		keep[id] = true
	}
	var out []string
	var st struct{ Slots []crashSlot }
	if b, err := os.ReadFile(filepath.Join(d.dataDir, "network", "state.json")); err == nil {
		if err := json.Unmarshal(b, &st); err != nil {
			return []string{"network state.json: " + err.Error()}
		}
	} else if !os.IsNotExist(err) {
		return []string{"network state.json: " + err.Error()}
	}
	names, veths, ips := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, s := range st.Slots {
		switch {
		case stopped:
			out = append(out, fmt.Sprintf("network slot %s (owner %q, %s) after a graceful stop", s.Name, s.Owner, s.IP))
		case s.Owner != "" && !keep[s.Owner]:
			out = append(out, fmt.Sprintf("network slot %s of %s, which the daemon does not list", s.Name, s.Owner))
		default:
			names[s.Name], veths[s.Veth] = true, true
			if s.Owner != "" && s.IP != "" {
				ips[s.IP] = true
			}
		}
	}
	nsDir := filepath.Join(d.dataDir, "network", "ns")
	ents, _ := os.ReadDir(nsDir)
	for _, e := range ents {
		if !names[e.Name()] {
			out = append(out, "network namespace file "+e.Name()+" of no slot")
		}
	}
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fl := strings.Fields(sc.Text())
			if len(fl) > 4 && strings.HasPrefix(fl[4], nsDir+"/") && !names[filepath.Base(fl[4])] {
				out = append(out, "network namespace mount "+fl[4]+" of no slot")
			}
		}
		f.Close()
	}
	ports, _ := filepath.Glob("/sys/class/net/" + n.bridge + "/brif/*")
	for _, p := range ports {
		if !veths[filepath.Base(p)] {
			out = append(out, "veth "+filepath.Base(p)+" on the bridge of no slot")
		}
	}
	els, err := nftBoxElements(n.table)
	if err != nil {
		return append(out, err.Error())
	}
	inBoxes := map[string]bool{}
	for _, el := range els {
		if !ips[el.box] {
			out = append(out, fmt.Sprintf("firewall element %s %s of %s, no live box's address", el.set, el.key, el.box))
		}
		if el.set == "boxes" {
			inBoxes[el.box] = true
		}
	}
	// And the other way (so the checks above are not vacuous): every
	// leased address of a live box is in the firewall.
	for ip := range ips {
		if !inBoxes[ip] {
			out = append(out, "live box address "+ip+" missing from the firewall's boxes set")
		}
	}
	sort.Strings(out)
	return out
}

type nftBoxElement struct{ set, key, box string }

// nftBoxElements lists every element of the table's sets with the box
// address that leads its key (every set is keyed by box address first).
func nftBoxElements(table string) ([]nftBoxElement, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	sets, err := c.GetSets(&nftables.Table{Name: table, Family: nftables.TableFamilyINet})
	if err != nil {
		return nil, fmt.Errorf("sets of table %s: %w", table, err)
	}
	var out []nftBoxElement
	for _, s := range sets {
		els, err := c.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("elements of %s: %w", s.Name, err)
		}
		for _, el := range els {
			if el.IntervalEnd {
				continue // the end of an interval element: its start names the box
			}
			box := "(key too short)"
			if len(el.Key) >= 4 {
				box = netip.AddrFrom4([4]byte(el.Key[:4])).String()
			}
			out = append(out, nftBoxElement{set: s.Name, key: hex.EncodeToString(el.Key), box: box})
		}
	}
	return out, nil
}
