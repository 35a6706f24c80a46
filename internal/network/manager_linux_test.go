package network

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	goruntime "runtime"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/sbxdev/sbx/internal/testutil"
)

// testConfig returns a config with a bridge, subnet and table of the test's
// own, so tests never touch a real daemon's.
func testConfig(t *testing.T, upstream string) Config {
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	tag := hex.EncodeToString(b)
	return Config{
		StateDir: t.TempDir(), Bridge: "sbxt" + tag, Subnet: fmt.Sprintf("10.214.%d.0/24", b[0]),
		Table: "sbxt" + tag, DNSUpstreams: []string{upstream}, Logger: slog.Default(), LockDir: t.TempDir(),
	}
}

// inNetNS runs fn on a thread inside the namespace at path; sockets it
// opens stay in that namespace.
func inNetNS(t *testing.T, path string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		goruntime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			t.Error(err)
			return
		}
		ns, err := netns.GetFromPath(path)
		if err != nil {
			t.Error(err)
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			t.Error(err)
			return
		}
		fn()
		if netns.Set(orig) == nil {
			goruntime.UnlockOSThread()
		}
	}()
	<-done
}

func queryA(c net.Conn, name string) (byte, []netip.Addr, error) {
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	q, err := buildQuery(7, name)
	if err != nil {
		return 0, nil, err
	}
	if _, err := c.Write(q); err != nil {
		return 0, nil, err
	}
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	if err != nil {
		return 0, nil, err
	}
	return buf[3] & 0x0F, answerAddrs(buf[:n]), nil
}

func chainsOf(t *testing.T, table string) map[string]bool {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, ch := range chains {
		if ch.Table.Name == table {
			out[ch.Name] = true
		}
	}
	return out
}

func linkExists(name string) bool {
	_, err := netlink.LinkByName(name)
	return err == nil
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 100 {
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("timed out waiting for %s", what)
}

func TestManagerLifecycle(t *testing.T) {
	testutil.RequiresRoot(t)
	ctx := context.Background()
	upstream := startTestDNS(t, map[string][]netip.Addr{"a.allowed.test": {netip.MustParseAddr("198.51.100.10")}})
	cfg := testConfig(t, upstream)
	cfg.PoolSize = 1
	m, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	removed := false
	t.Cleanup(func() {
		if !removed {
			_ = m.Remove()
		}
	})
	if err := m.Cleanup(ctx, nil); err != nil {
		t.Fatal(err)
	}
	m.Start()

	att, err := m.Attach(ctx, "sb-one", Policy{Mode: ModePublic})
	if err != nil {
		t.Fatal(err)
	}
	if !att.IP.IsValid() || len(att.DNS) != 1 || att.DNS[0] != m.Gateway().String() {
		t.Fatalf("attachment %+v: want an address and the gateway as DNS", att)
	}
	sl := slotOf(m, "sb-one")
	if !linkExists(sl.Veth) {
		t.Fatalf("veth %s missing", sl.Veth)
	}
	if ch := chainsOf(t, cfg.Table); !ch["from_box"] || !ch["forward"] || len(ch) != 7 {
		t.Fatalf("chains %v: want the 7 base chains, none of the box's own", ch)
	}
	if !inSet(t, cfg.Table, setBoxes, sl.IP) || !inSet(t, cfg.Table, setPublic, sl.IP) {
		t.Fatalf("box %s is not in the boxes and public sets", sl.IP)
	}
	if l, _ := netlink.LinkByName(sl.Veth); l.Attrs().Protinfo != nil && !l.Attrs().Protinfo.Isolated {
		t.Errorf("bridge port %s is not isolated", sl.Veth)
	}
	// From inside: the forwarder answers, public mode resolves anything.
	inNetNS(t, att.NetNS, func() {
		c, err := net.Dial("udp", net.JoinHostPort(m.Gateway().String(), "53"))
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		rc, addrs, err := queryA(c, "a.allowed.test")
		if err != nil || rc != 0 || len(addrs) != 1 {
			t.Errorf("query from box: rcode %d addrs %v err %v", rc, addrs, err)
		}
		if _, err := os.ReadFile("/proc/sys/net/ipv6/conf/all/disable_ipv6"); err != nil {
			t.Error(err)
		}
	})

	// ALLOW: the forwarder refuses other names.
	if _, err := m.Update(ctx, "sb-one", Policy{Mode: ModeAllow, AllowDomains: []string{"*.other.test"}}); err != nil {
		t.Fatal(err)
	}
	inNetNS(t, att.NetNS, func() {
		c, err := net.Dial("udp", net.JoinHostPort(m.Gateway().String(), "53"))
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		if rc, _, err := queryA(c, "a.allowed.test"); err != nil || rc != dnsRcodeRefused {
			t.Errorf("allow mode query: rcode %d err %v, want REFUSED", rc, err)
		}
	})
	// An allowed name's addresses enter the box's DNS set with a timeout
	// (the answer's TTL of 60s raised to learnedMin), and asking again
	// within the timeout keeps one element.
	if _, err := m.Update(ctx, "sb-one", Policy{Mode: ModeAllow, AllowDomains: []string{"*.allowed.test"}}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		inNetNS(t, att.NetNS, func() {
			c, err := net.Dial("udp", net.JoinHostPort(m.Gateway().String(), "53"))
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			if rc, addrs, err := queryA(c, "a.allowed.test"); err != nil || rc != 0 || len(addrs) != 1 {
				t.Errorf("allowed query: rcode %d addrs %v err %v", rc, addrs, err)
			}
		})
	}
	if inSet(t, cfg.Table, setPublic, sl.IP) {
		t.Errorf("allow-mode box %s is still in the public set", sl.IP)
	}
	els := learnedOf(t, cfg.Table, sl.IP)
	if len(els) != 1 || netip.AddrFrom4([4]byte(els[0].Key[4:])) != netip.MustParseAddr("198.51.100.10") ||
		els[0].Timeout != learnedMin || els[0].Expires <= 0 || els[0].Expires > learnedMin {
		t.Errorf("DNS set elements %+v: want 198.51.100.10 once, with timeout %v", els, learnedMin)
	}

	// NONE unplugs the veth; back to PUBLIC plugs a new one.
	oldIP := sl.IP
	if att, err = m.Update(ctx, "sb-one", Policy{Mode: ModeNone}); err != nil || att.IP.IsValid() {
		t.Fatalf("update to none: %+v, %v", att, err)
	}
	if linkExists(sl.Veth) || inSet(t, cfg.Table, setBoxes, oldIP) || len(learnedOf(t, cfg.Table, oldIP)) != 0 {
		t.Errorf("veth or set elements left after switching to none")
	}
	if att, err = m.Update(ctx, "sb-one", Policy{Mode: ModePublic}); err != nil || !att.IP.IsValid() {
		t.Fatalf("update to public: %+v, %v", att, err)
	}
	if !linkExists(sl.Veth) {
		t.Errorf("no veth after switching back to public")
	}

	// A none box from scratch, and stats.
	if att, err := m.Attach(ctx, "sb-two", Policy{Mode: ModeNone}); err != nil || att.IP.IsValid() {
		t.Fatalf("attach none: %+v %v", att, err)
	}
	if _, err := m.Stats("sb-one"); err != nil {
		t.Error(err)
	}

	// Detach removes everything (in the background).
	if err := m.Detach(ctx, "sb-one"); err != nil {
		t.Fatal(err)
	}
	veth, ns := sl.Veth, att.NetNS
	eventually(t, "detach", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		_, err := os.Stat(ns)
		return !linkExists(veth) && errors.Is(err, os.ErrNotExist) && m.ipam.byOwner("sb-one") == nil
	})

	// A "crash": a new manager over the same state cleans up what nobody keeps.
	m.closeLoops()
	m.fw.close()
	m.lock.release() // the kernel's part when a daemon dies
	m2, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	m = m2
	if _, err := m.Recover(ctx, "sb-two", nil); err != nil {
		t.Fatalf("recover sb-two: %v", err)
	}
	if err := m.Cleanup(ctx, map[string]bool{}); err != nil {
		t.Fatal(err)
	}
	if n := slotCount(m); n != 0 {
		t.Errorf("%d slots left after cleanup", n)
	}
	if ents, _ := os.ReadDir(cfg.StateDir + "/ns"); len(ents) != 0 {
		t.Errorf("namespace files left: %v", ents)
	}
	removed = true
	if err := m.Remove(); err != nil {
		t.Fatal(err)
	}
	if linkExists(cfg.Bridge) {
		t.Errorf("bridge %s left", cfg.Bridge)
	}
	if len(chainsOf(t, cfg.Table)) != 0 {
		t.Errorf("table %s left", cfg.Table)
	}
}

// slotOf reads the IPAM under the manager's lock (its pool filler writes it).
func slotOf(m *Manager, owner string) *slot {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ipam.byOwner(owner)
}

func slotCount(m *Manager) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.ipam.slots)
}

// setElements lists the elements of one of the table's sets.
func setElements(t *testing.T, table, set string) []nftables.SetElement {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tb := &nftables.Table{Name: table, Family: nftables.TableFamilyINet}
	s, err := c.GetSetByName(tb, set)
	if err != nil {
		t.Fatalf("set %s: %v", set, err)
	}
	els, err := c.GetSetElements(s)
	if err != nil {
		t.Fatal(err)
	}
	return els
}

// inSet reports whether a set keyed by address holds a.
func inSet(t *testing.T, table, set string, a netip.Addr) bool {
	t.Helper()
	for _, el := range setElements(t, table, set) {
		if string(el.Key) == string(addrKey(a)) {
			return true
		}
	}
	return false
}

// learnedOf lists the learned elements of the box at box.
func learnedOf(t *testing.T, table string, box netip.Addr) []nftables.SetElement {
	t.Helper()
	var out []nftables.SetElement
	for _, el := range setElements(t, table, setLearned) {
		if len(el.Key) == 8 && string(el.Key[:4]) == string(addrKey(box)) {
			out = append(out, el)
		}
	}
	return out
}
