package integration

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// scaleBox is a box of TestNetworkRestartAtScale and what its policy lets
// it reach.
type scaleBox struct {
	sb   *sbx.Sandbox
	kind string // public, allow-domains, allow-cidr, none, server
	ip   string
}

// netScaleN is how many networked boxes TestNetworkRestartAtScale makes:
// 15 was enough for the old daemon's one-batch table rebuild to overflow
// netlink (ENOBUFS) at every start. SBX_NETSCALE_N raises it.
func netScaleN(t *testing.T) int {
	if s := os.Getenv("SBX_NETSCALE_N"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 8 {
			t.Fatalf("SBX_NETSCALE_N=%q: want a number ≥ 8", s)
		}
		return n
	}
	return 24
}

// parallel runs fn for 0..n-1 on 4 workers.
func parallel(n int, fn func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				fn(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

// fetchCode runs curl in a box and returns its exit code (0: fetched).
func fetchCode(ctx context.Context, sb *sbx.Sandbox, target string) (int, error) {
	res, err := sb.RunShell(ctx, "curl -sSf --max-time 3 -o /dev/null http://"+target+"/")
	if err != nil {
		return -1, err
	}
	return int(res.Code), nil
}

// TestNetworkRestartAtScale: with two dozen networked boxes of every mode,
// a graceful restart, a kill -9 and a kill -9 in the middle of a burst of
// creates each bring the daemon back serving, with every box's address kept,
// exec working in all of them and each box's policy in force (reachability
// in every box, what must stay unreachable in a few, isolation between
// boxes). The old daemon rebuilt its table (chains and rules of every box)
// in one netlink batch and, from 15 boxes on, never started again.
func TestNetworkRestartAtScale(t *testing.T) {
	d := startNetDaemon(t)
	ctx := ctxT(t, 15*time.Minute)
	in := d.inet
	n := netScaleN(t)

	policy := func(i int) (string, *sbx.NetworkPolicy) {
		switch i % 6 {
		case 1:
			return "allow-domains", &sbx.NetworkPolicy{Mode: "allow", AllowDomains: []string{"*.allowed.test"}}
		case 3:
			return "allow-cidr", &sbx.NetworkPolicy{Mode: "allow", AllowCIDRs: []string{in.public + "/32"}}
		case 5:
			if i == 5 {
				return "none", &sbx.NetworkPolicy{Mode: "none"}
			}
		}
		return "public", nil
	}
	var mu sync.Mutex
	var boxes []*scaleBox
	add := func(kind string, sb *sbx.Sandbox) {
		mu.Lock()
		defer mu.Unlock()
		boxes = append(boxes, &scaleBox{sb: sb, kind: kind, ip: sb.Info.GetIpAddress()})
	}
	restart := func(how string, stop func()) {
		t.Helper()
		stop()
		start := time.Now()
		d.start()
		t.Logf("%s: serving %v after start with %d boxes", how, time.Since(start).Round(time.Millisecond), len(boxes))
	}

	// The baseline, in the same run: a restart with no boxes.
	restart("graceful restart (baseline)", d.stop)
	server := createNet(t, ctx, d, nil, "python3", "-m", "http.server", "8000")
	add("server", server)
	parallel(n-1, func(i int) {
		kind, p := policy(i)
		sb, err := d.client().Create(ctx, sbx.CreateOptions{Network: p})
		if err != nil {
			t.Errorf("create box %d (%s): %v", i, kind, err)
			return
		}
		d.remember(sb.ID)
		add(kind, sb)
	})
	if t.Failed() {
		t.FailNow()
	}

	check := func(phase string) {
		t.Helper()
		start := time.Now()
		// Every box: same address, exec works, its policy's positive case.
		parallel(len(boxes), func(i int) {
			b := boxes[i]
			sb, err := d.client().Get(ctx, b.sb.ID)
			if err != nil {
				t.Errorf("%s: get %s (%s): %v", phase, b.sb.ID, b.kind, err)
				return
			}
			b.sb = sb
			if got := sb.Info.GetIpAddress(); got != b.ip {
				t.Errorf("%s: %s (%s) has address %q, want %q", phase, sb.ID, b.kind, got, b.ip)
			}
			target := ""
			switch b.kind {
			case "public", "allow-cidr":
				target = in.public
			case "allow-domains":
				target = "a.allowed.test"
			case "server":
				target = "127.0.0.1:8000"
			}
			if target == "" {
				if res, err := sb.RunShell(ctx, "true"); err != nil || res.Code != 0 {
					t.Errorf("%s: exec in %s (%s): %v", phase, sb.ID, b.kind, err)
				}
				return
			}
			// The server may still be starting after a restart of its box's
			// daemon; the others answer at once.
			deadline := time.Now().Add(20 * time.Second)
			for {
				code, err := fetchCode(ctx, sb, target)
				if err != nil {
					t.Errorf("%s: exec in %s (%s): %v", phase, sb.ID, b.kind, err)
					return
				}
				if code == 0 {
					return
				}
				if time.Now().After(deadline) {
					t.Errorf("%s: %s (%s, %s) cannot reach %s: curl exit %d", phase, sb.ID, b.kind, b.ip, target, code)
					return
				}
				time.Sleep(200 * time.Millisecond)
			}
		})
		// What must stay closed, in the first and last box of each kind
		// (the last ones were restored in a later batch than the first).
		first, last := map[string]*scaleBox{}, map[string]*scaleBox{}
		for _, b := range boxes {
			if first[b.kind] == nil {
				first[b.kind] = b
			}
			last[b.kind] = b
		}
		deny := map[string][]string{
			"public":        {in.private, in.metadata, d.gateway + ":" + strings.Split(d.addr, ":")[1], server.Info.GetIpAddress() + ":8000"},
			"allow-domains": {in.public, in.blocked, server.Info.GetIpAddress() + ":8000"},
			"allow-cidr":    {in.allowed, in.private, server.Info.GetIpAddress() + ":8000"},
			"none":          {in.public},
		}
		var probes []func()
		for _, set := range []map[string]*scaleBox{first, last} {
			for kind, b := range set {
				for _, target := range deny[kind] {
					probes = append(probes, func() {
						code, err := fetchCode(ctx, b.sb, target)
						if err != nil {
							t.Errorf("%s: exec in %s (%s): %v", phase, b.sb.ID, kind, err)
						} else if code == 0 {
							t.Errorf("%s: %s (%s, %s) reaches %s", phase, b.sb.ID, kind, b.ip, target)
						}
					})
				}
			}
		}
		parallel(len(probes), func(i int) { probes[i]() })
		t.Logf("%s: %d boxes checked in %v", phase, len(boxes), time.Since(start).Round(time.Millisecond))
	}
	check("before any restart")
	restart("graceful restart", d.stop)
	check("after a graceful restart")
	restart("kill -9", d.kill9)
	check("after kill -9")

	// kill -9 while creates are in flight: once some are acknowledged.
	acked := make(chan *scaleBox, 8)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			kind, p := policy(i * 2) // public and allow-domains
			sb, err := d.client().Create(ctx, sbx.CreateOptions{Network: p})
			if err == nil {
				d.remember(sb.ID)
				acked <- &scaleBox{sb: sb, kind: kind, ip: sb.Info.GetIpAddress()}
			}
		}()
	}
	boxes = append(boxes, <-acked, <-acked)
	restart("kill -9 during creates", d.kill9)
	wg.Wait()
	close(acked)
	for b := range acked {
		boxes = append(boxes, b)
	}
	check("after kill -9 during creates")

	// Reconciled: every slot on disk is a live box's or the pool's, every
	// namespace file a slot's, every sbx veth on the bridge a slot's.
	live, liveIPs := map[string]bool{}, map[string]bool{}
	list, err := d.client().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		live[sb.ID] = true
		d.remember(sb.ID)
		if ip := sb.Info.GetIpAddress(); ip != "" {
			liveIPs[ip] = true
		}
	}
	// The firewall holds the live boxes, all of them and only them.
	for _, ip := range nftSetAddrs(t, d.table, "boxes") {
		if !liveIPs[ip] {
			t.Errorf("the firewall's boxes set holds %s, no live box's address", ip)
		}
		delete(liveIPs, ip)
	}
	for ip := range liveIPs {
		t.Errorf("live box %s is not in the firewall's boxes set", ip)
	}
	for _, b := range boxes {
		if !live[b.sb.ID] {
			t.Errorf("acknowledged box %s (%s) is gone", b.sb.ID, b.kind)
		}
	}
	st := d.state(t)
	veths, names := map[string]bool{}, map[string]bool{}
	for _, s := range st.Slots {
		veths[s.Veth], names[s.Name] = true, true
		if s.Owner != "" && !live[s.Owner] {
			t.Errorf("network slot %s of %s, which does not exist, is left", s.Name, s.Owner)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(d.dataDir, "network", "ns"))
	for _, e := range ents {
		if !names[e.Name()] {
			t.Errorf("namespace %s belongs to no slot", e.Name())
		}
	}
	ports, _ := filepath.Glob("/sys/class/net/" + d.bridge + "/brif/*")
	for _, p := range ports {
		if !veths[filepath.Base(p)] {
			t.Errorf("veth %s on the bridge belongs to no slot", filepath.Base(p))
		}
	}
}

// nftSetAddrs lists the addresses in a set of a table keyed by address.
func nftSetAddrs(t *testing.T, table, set string) []string {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.GetSetByName(&nftables.Table{Name: table, Family: nftables.TableFamilyINet}, set)
	if err != nil {
		t.Fatalf("set %s of %s: %v", set, table, err)
	}
	els, err := c.GetSetElements(s)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, el := range els {
		if len(el.Key) == 4 {
			out = append(out, netip.AddrFrom4([4]byte(el.Key)).String())
		}
	}
	return out
}
