package network

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/sbxdev/sbx/internal/testutil"
)

// portElements lists the port guard's elements of table (as portKey
// bytes, hex-free strings for comparison).
func portElements(t *testing.T, table string) []string {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.GetSetByName(&nftables.Table{Name: table, Family: nftables.TableFamilyBridge}, setPorts)
	if err != nil {
		t.Fatalf("ports set of bridge table %s: %v", table, err)
	}
	els, err := c.GetSetElements(s)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, el := range els {
		out = append(out, string(el.Key))
	}
	slices.Sort(out)
	return out
}

// setEth0MAC gives eth0 in the namespace at path another MAC (a box made
// before MACs were fixed by the address).
func setEth0MAC(t *testing.T, path string, mac net.HardwareAddr) {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetHardwareAddr(l, mac); err != nil {
		t.Fatal(err)
	}
}

// TestPortGuardBindings: each attached box's veth is bound to its MAC
// (fixed by its address) and address in the bridge table, every port of the
// bridge is in the daemon's port group, a detached box's binding goes, and
// a restart binds a box whose state has no MAC (made by an older daemon,
// with a random one) to the MAC its eth0 has.
func TestPortGuardBindings(t *testing.T) {
	testutil.RequiresRoot(t)
	ctx := context.Background()
	cfg := testConfig(t, startTestDNS(t, nil))
	m, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Remove() })
	m.Start()
	a, err := m.Attach(ctx, "sb-a", Policy{Mode: ModePublic})
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Attach(ctx, "sb-b", Policy{Mode: ModePublic})
	if err != nil {
		t.Fatal(err)
	}
	slotOf := func(id string) slot {
		m.mu.Lock()
		defer m.mu.Unlock()
		return *m.ipam.byOwner(id)
	}
	sa, sb := slotOf("sb-a"), slotOf("sb-b")
	want := []string{string(portKey(sa.Veth, boxMAC(a.IP), a.IP)), string(portKey(sb.Veth, boxMAC(b.IP), b.IP))}
	slices.Sort(want)
	if got := portElements(t, cfg.Table); !slices.Equal(got, want) {
		t.Errorf("ports elements: got %q, want %q", got, want)
	}
	for _, sl := range []slot{sa, sb} {
		l, err := netlink.LinkByName(sl.Veth)
		if err != nil {
			t.Fatal(err)
		}
		if l.Attrs().Group != portGroup(cfg.Bridge) {
			t.Errorf("veth %s in group %d, want %d", sl.Veth, l.Attrs().Group, portGroup(cfg.Bridge))
		}
		ip := sl.IP
		if got, err := peerMAC(nsPath(cfg.StateDir, sl.Name)); err != nil || got.String() != boxMAC(ip).String() {
			t.Errorf("eth0 of %s: MAC %v (%v), want %v", sl.Name, got, err, boxMAC(ip))
		}
	}
	if err := m.Detach(ctx, "sb-b"); err != nil {
		t.Fatal(err)
	}
	if got, want := portElements(t, cfg.Table), []string{string(portKey(sa.Veth, boxMAC(a.IP), a.IP))}; !slices.Equal(got, want) {
		t.Errorf("ports elements after detaching sb-b: got %q, want %q", got, want)
	}

	// An older daemon's box: a random MAC, none in state.json.
	m.Close()
	legacy := net.HardwareAddr{0x0a, 0x11, 0x22, 0x33, 0x44, 0x55}
	setEth0MAC(t, a.NetNS, legacy)
	stateFile := filepath.Join(cfg.StateDir, "state.json")
	raw, err := os.ReadFile(stateFile)
	if err != nil {
		t.Fatal(err)
	}
	var f map[string]any
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	for _, s := range f["slots"].([]any) {
		delete(s.(map[string]any), "mac")
	}
	if raw, err = json.Marshal(f); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stateFile, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if m, err = New(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if got, want := portElements(t, cfg.Table), []string{string(portKey(sa.Veth, legacy, a.IP))}; !slices.Equal(got, want) {
		t.Errorf("ports elements after a restart over a slot without a MAC: got %q, want %q", got, want)
	}
	if got := slotOf("sb-a").MAC; got != legacy.String() {
		t.Errorf("recorded MAC of sb-a: %q, want %s", got, legacy)
	}
}
