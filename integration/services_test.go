package integration

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// Daemon services a sandbox can reach (ATTACK-CLASSES class 4): one box
// (or the clients of its ports) opening thousands of idle connections to
// the DNS forwarder, the egress proxy or the port proxy, and flooding the
// forwarder, must not take the daemon's descriptors, slow its API or break
// a neighbour's service; when the attack ends everything recovers.

// fdCount is the number of descriptors process pid has open.
func fdCount(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatalf("count the daemon's descriptors: %v", err)
	}
	return len(ents)
}

// listP50 is the median time of 20 List calls.
func listP50(t *testing.T, ctx context.Context, c *sbx.Client) time.Duration {
	t.Helper()
	var ds []time.Duration
	for range 20 {
		start := time.Now()
		if _, err := c.List(ctx); err != nil {
			t.Fatalf("list: %v", err)
		}
		ds = append(ds, time.Since(start))
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// fdWatch samples a process's descriptor count until stop.
type fdWatch struct {
	max  atomic.Int64
	stop chan struct{}
	done chan struct{}
}

func watchFDs(t *testing.T, pid int) *fdWatch {
	w := &fdWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil && int64(len(ents)) > w.max.Load() {
				w.max.Store(int64(len(ents)))
			}
			select {
			case <-w.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return w
}

func (w *fdWatch) end() int {
	close(w.stop)
	<-w.done
	return int(w.max.Load())
}

// attackPy opens N idle TCP connections to HOST:PORT (non-blocking: the
// box does not wait for the daemon to accept), says so in
// /tmp/attack-started, then for DUR seconds floods HOST:53 with UDP queries
// (if FLOOD is 1) or just holds the connections, and closes everything by
// exiting.
const attackPy = `
import resource, socket, struct, sys, time
host, port, n, dur, flood = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1"
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
socks = []
for i in range(n):
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex((host, port))
    socks.append(s)
open("/tmp/attack-started", "w").close()
q = struct.pack(">HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0) + b"\x06public\x04test\x00" + struct.pack(">HH", 1, 1)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.setblocking(False)
sent = 0
end = time.time() + dur
while time.time() < end:
    if not flood:
        time.sleep(0.05)
        continue
    for _ in range(100):
        try:
            u.sendto(q, (host, 53))
            sent += 1
        except OSError:
            pass
    try:
        while True:
            u.recv(4096)
    except OSError:
        pass
print("connections", len(socks), "udp queries sent", sent)
`

// boxAttack runs attackPy in sb in the background; started waits for its
// connections to be opened, wait for it to end.
type boxAttack struct {
	done chan struct{}
	out  string
	err  error
}

func startBoxAttack(t *testing.T, ctx context.Context, sb *sbx.Sandbox, host string, port, n int, dur time.Duration, flood bool) *boxAttack {
	t.Helper()
	fl := "0"
	if flood {
		fl = "1"
	}
	a := &boxAttack{done: make(chan struct{})}
	go func() {
		defer close(a.done)
		res, err := sb.RunShell(ctx, fmt.Sprintf("rm -f /tmp/attack-started; /usr/bin/python3 - %s %d %d %g %s <<'EOF'\n%s\nEOF", host, port, n, dur.Seconds(), fl, attackPy))
		if err == nil && res.Code != 0 {
			err = fmt.Errorf("exit %d: %s", res.Code, res.Stderr)
		}
		if res != nil {
			a.out = string(res.Stdout)
		}
		a.err = err
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := sb.RunShell(ctx, "test -e /tmp/attack-started")
		if err == nil && res.Code == 0 {
			return a
		}
		select {
		case <-a.done:
			t.Fatalf("the attack ended before it started: %v", a.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the attack did not start within 60s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (a *boxAttack) wait(t *testing.T) {
	t.Helper()
	<-a.done
	if a.err != nil {
		t.Fatalf("attack: %v", a.err)
	}
	t.Logf("attack: %s", strings.TrimSpace(a.out))
}

// checkAPI compares List under attack with at rest: generous (5×, and
// 50 ms of slack for a machine whose baseline is a millisecond), relative.
func checkAPI(t *testing.T, base, under time.Duration) {
	t.Helper()
	t.Logf("List p50: %v at rest, %v under attack", base, under)
	if limit := max(5*base, base+50*time.Millisecond); under > limit {
		t.Errorf("List p50 under attack %v, want at most %v (at rest %v)", under, limit, base)
	}
}

// waitFDs waits for the daemon's descriptors to come back to at most want.
func waitFDs(t *testing.T, pid, want int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for fdCount(t, pid) > want {
		if time.Now().After(deadline) {
			t.Fatalf("the daemon holds %d descriptors 30s after the attack, want at most %d (recovered)", fdCount(t, pid), want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestDNSForwarderHostileNeighbour(t *testing.T) {
	d := startNetDaemon(t)
	ctx := ctxT(t, 5*time.Minute)
	public := &sbx.NetworkPolicy{Mode: "public"}
	attacker, neighbour := createNet(t, ctx, d, public), createNet(t, ctx, d, public)
	for _, sb := range []*sbx.Sandbox{attacker, neighbour} {
		if got := resolve(t, ctx, sb, "public.test"); got != inetPublic {
			t.Fatalf("before the attack public.test resolves to %q, want %s", got, inetPublic)
		}
	}
	pid := d.cmd.Process.Pid
	c := d.client()
	base := listP50(t, ctx, c)
	baseFDs := fdCount(t, pid)

	fds := watchFDs(t, pid)
	atk := startBoxAttack(t, ctx, attacker, d.gateway, 53, 5000, 8*time.Second, true)
	under := listP50(t, ctx, c)
	for i := range 3 {
		if got := resolve(t, ctx, neighbour, "public.test"); got != inetPublic {
			t.Errorf("neighbour's lookup %d during the attack: got %q, want %s", i, got, inetPublic)
		}
	}
	atk.wait(t)
	maxFDs := fds.end()
	t.Logf("daemon descriptors: %d at rest, at most %d under attack", baseFDs, maxFDs)
	checkAPI(t, base, under)
	// 5000 connections were opened; the forwarder keeps 16 per box.
	if maxFDs > baseFDs+500 {
		t.Errorf("the daemon held %d descriptors under attack, want at most %d (its own %d and the box's bounded share)", maxFDs, baseFDs+500, baseFDs)
	}

	// Recovery: descriptors come back, the attacker resolves again.
	waitFDs(t, pid, baseFDs+20)
	deadline := time.Now().Add(20 * time.Second)
	for resolve(t, ctx, attacker, "public.test") != inetPublic {
		if time.Now().After(deadline) {
			t.Fatal("the attacker's own lookups do not work 20s after its attack")
		}
	}
	if got := resolve(t, ctx, neighbour, "public.test"); got != inetPublic {
		t.Errorf("neighbour's lookup after the attack: got %q, want %s", got, inetPublic)
	}
}

func TestEgressProxyHostileNeighbour(t *testing.T) {
	d := startNetDaemon(t)
	ctx := ctxT(t, 5*time.Minute)
	allow := &sbx.NetworkPolicy{Mode: "allow", AllowDomains: []string{"*.allowed.test"}}
	attacker, neighbour := createNet(t, ctx, d, allow), createNet(t, ctx, d, allow)
	if !reach(t, ctx, neighbour, "a.allowed.test") {
		t.Fatal("before the attack the neighbour cannot fetch http://a.allowed.test/ through the proxy")
	}
	pid := d.cmd.Process.Pid
	c := d.client()
	base := listP50(t, ctx, c)
	baseFDs := fdCount(t, pid)

	fds := watchFDs(t, pid)
	// Idle connections to an allowed address's port 80: redirected to the
	// proxy, which waits for their first bytes.
	atk := startBoxAttack(t, ctx, attacker, inetAllowed, 80, 3000, 8*time.Second, false)
	under := listP50(t, ctx, c)
	for i := range 3 {
		if !reach(t, ctx, neighbour, "a.allowed.test") {
			t.Errorf("neighbour's fetch %d through the proxy during the attack failed", i)
		}
	}
	atk.wait(t)
	maxFDs := fds.end()
	t.Logf("daemon descriptors: %d at rest, at most %d under attack", baseFDs, maxFDs)
	checkAPI(t, base, under)
	if maxFDs > baseFDs+600 {
		t.Errorf("the daemon held %d descriptors under attack, want at most %d (its own %d and the box's bounded share)", maxFDs, baseFDs+600, baseFDs)
	}
	waitFDs(t, pid, baseFDs+20)
	if !reach(t, ctx, attacker, "a.allowed.test") {
		t.Error("the attacker cannot fetch through the proxy after its attack (no recovery)")
	}
}

// holdPy listens on 127.0.0.1:8000 and holds every connection it accepts
// until /tmp/release appears.
const holdPy = `
import os, resource, socket, threading, time
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8000))
s.listen(4096)
held = []
lock = threading.Lock()
def release():
    while True:
        time.sleep(0.1)
        if os.path.exists("/tmp/release"):
            with lock:
                for c in held:
                    c.close()
                held.clear()
            os.remove("/tmp/release")
threading.Thread(target=release, daemon=True).start()
while True:
    c, _ = s.accept()
    with lock:
        held.append(c)
`

func holdSandbox(t *testing.T, ctx context.Context, d *daemon) *sbx.Sandbox {
	t.Helper()
	sb, err := d.client().Create(ctx, sbx.CreateOptions{Command: []string{"/usr/bin/python3", "-c", holdPy}, MemoryBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ports, err := sb.Ports(ctx)
		if err != nil {
			t.Fatalf("list ports: %v", err)
		}
		if slices.ContainsFunc(ports, func(p sbx.Port) bool { return p.Port == 8000 }) {
			return sb
		}
		if time.Now().After(deadline) {
			t.Fatal("the holding server did not listen in 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// openTCP asks the daemon at addr for a raw TCP pipe to port 8000 of sb
// and returns the connection (nil if none came) and the answer's status
// (0: none within 5 s).
func openTCP(addr, sb string) (net.Conn, int) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, 0
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "GET /tcp/%s/8000 HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: sbx-tcp\r\n\r\n", sb, addr); err != nil {
		return c, 0
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return c, 0
	}
	_ = c.SetDeadline(time.Time{})
	return c, resp.StatusCode
}

func TestPortProxyHostileNeighbour(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 5*time.Minute)
	attacked, neighbour := holdSandbox(t, ctx, d), holdSandbox(t, ctx, d)
	pid := d.cmd.Process.Pid
	c := d.client()
	base := listP50(t, ctx, c)
	baseFDs := fdCount(t, pid)

	fds := watchFDs(t, pid)
	const n = 3000
	var mu sync.Mutex
	var conns []net.Conn
	codes := map[int]int{}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 200)
	for range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			conn, code := openTCP(d.addr, attacked.ID)
			mu.Lock()
			defer mu.Unlock()
			codes[code]++
			if conn != nil {
				conns = append(conns, conn)
			}
		}()
	}
	wg.Wait()
	under := listP50(t, ctx, c)
	nconn, ncode := openTCP(d.addr, neighbour.ID)
	if nconn != nil {
		nconn.Close()
	}
	if ncode != http.StatusSwitchingProtocols {
		t.Errorf("neighbour's raw TCP while the other sandbox is flooded: got %d, want 101", ncode)
	}
	maxFDs := fds.end()
	t.Logf("answers to %d raw TCP requests: %v; daemon descriptors %d at rest, at most %d under attack", n, codes, baseFDs, maxFDs)
	checkAPI(t, base, under)
	if maxFDs > baseFDs+1500 {
		t.Errorf("the daemon held %d descriptors with %d raw TCP connections to one sandbox, want at most %d", maxFDs, n, baseFDs+1500)
	}
	if codes[http.StatusServiceUnavailable] == 0 {
		t.Errorf("no raw TCP request was refused (503) of %d to one sandbox: answers %v", n, codes)
	}
	// The clients go and the box lets go: so does the daemon (a pipe whose
	// client left but whose box holds on lingers a minute), and the
	// sandbox is reachable again.
	for _, conn := range conns {
		conn.Close()
	}
	mustRun(t, ctx, attacked, "touch /tmp/release")
	waitFDs(t, pid, baseFDs+20)
	conn, code := openTCP(d.addr, attacked.ID)
	if conn != nil {
		conn.Close()
	}
	if code != http.StatusSwitchingProtocols {
		t.Errorf("raw TCP to the attacked sandbox after the attack: got %d, want 101", code)
	}
}

// nftSnapshot describes a table: its chains with their rules, its sets
// with their elements.
func nftSnapshot(t *testing.T, table string) string {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tbl := &nftables.Table{Name: table, Family: nftables.TableFamilyINet}
	var lines []string
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains {
		if ch.Table.Name != table {
			continue
		}
		rules, err := c.GetRules(tbl, ch)
		if err != nil {
			t.Fatalf("rules of %s: %v", ch.Name, err)
		}
		for _, r := range rules {
			b, _ := json.Marshal(r.Exprs)
			lines = append(lines, fmt.Sprintf("chain %s rule %d %s", ch.Name, r.Handle, b))
		}
		lines = append(lines, "chain "+ch.Name)
	}
	sets, err := c.GetSets(tbl)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sets {
		els, err := c.GetSetElements(s)
		if err != nil {
			t.Fatalf("elements of %s: %v", s.Name, err)
		}
		lines = append(lines, "set "+s.Name)
		for _, e := range els {
			verdict := ""
			if v := e.VerdictData; v != nil {
				verdict = fmt.Sprintf("%d %s", v.Kind, v.Chain)
			}
			lines = append(lines, fmt.Sprintf("set %s element %s %s %s", s.Name, hex.EncodeToString(e.Key), hex.EncodeToString(e.KeyEnd), verdict))
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

func TestSecondDaemonSameBridgeAndTable(t *testing.T) {
	a := startNetDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	sb := createNet(t, ctx, a, &sbx.NetworkPolicy{Mode: "public"})
	if got := resolve(t, ctx, sb, "public.test"); got != inetPublic {
		t.Fatalf("before: public.test resolves to %q, want %s", got, inetPublic)
	}
	before := nftSnapshot(t, a.table)
	boxKey := hex.EncodeToString(netip.MustParseAddr(sb.Info.GetIpAddress()).AsSlice())
	if !strings.Contains(before, "set boxes element "+boxKey) {
		t.Fatalf("daemon A's table does not hold its box %s:\n%s", sb.Info.GetIpAddress(), before)
	}

	// Daemon B: its own data dir and API address, A's bridge, subnet and
	// table (the subnet too, as an operator copying A's flags would).
	dataB, err := os.MkdirTemp("", "sbx-e2e-data-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dataB) })
	_ = os.Chmod(dataB, 0o711)
	subnet := strings.TrimSuffix(a.gateway, ".1") + ".0/24"
	bctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(bctx, a.bin, "serve", "--listen", freeAddr(t), "--data-dir", dataB, "--warm-pool", "0",
		"--network=true", "--net-bridge", a.bridge, "--net-table", a.table, "--net-subnet", subnet,
		"--dns-upstream", a.inet.dns, "--net-pool", "0")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	if err == nil || bctx.Err() != nil {
		t.Fatalf("daemon B on A's bridge and table: got %v (timed out: %v), want it to fail at start\n%s", err, bctx.Err() != nil, out.String())
	}
	msg := out.String()
	for _, want := range []string{"in use by another sbx daemon", fmt.Sprintf("pid %d", a.cmd.Process.Pid), filepath.Join(a.dataDir, "network")} {
		if !strings.Contains(msg, want) {
			t.Errorf("daemon B's error does not say %q:\n%s", want, tail(msg, 10))
		}
	}

	if after := nftSnapshot(t, a.table); after != before {
		t.Errorf("daemon A's table changed when B started:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if !linkExists(a.bridge) {
		t.Error("daemon A's bridge is gone")
	}
	if got := resolve(t, ctx, sb, "public.test"); got != inetPublic {
		t.Errorf("after B's attempt A's box resolves public.test to %q, want %s", got, inetPublic)
	}
	if !reach(t, ctx, sb, inetPublic) {
		t.Error("after B's attempt A's box cannot reach the internet")
	}
	if list, err := a.client().List(ctx); err != nil || len(list) != 1 {
		t.Errorf("daemon A lists %d sandboxes (err %v), want its one", len(list), err)
	}
}

// emfilePy waits DELAY seconds (after saying so in /tmp/attack-ready), then
// opens N80 idle connections to TARGET:80 and N53 to GW:53 (more than the
// daemon's lowered descriptor limit leaves it) and holds them DUR seconds.
const emfilePy = `
import socket, sys, time
gw, target, n80, n53, delay, dur = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
open("/tmp/attack-ready", "w").close()
time.sleep(delay)
socks = []
for host, port, n in ((target, 80, n80), (gw, 53, n53)):
    for i in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex((host, port))
        socks.append(s)
time.sleep(dur)
print("connections", len(socks))
`

// cpuTicks is the user and system time process pid has used, in clock ticks.
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command name (which may hold spaces) start at
	// the state (field 3); utime and stime are fields 14 and 15.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	var u, s int64
	if _, err := fmt.Sscan(f[11], &u); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Sscan(f[12], &s); err != nil {
		t.Fatal(err)
	}
	return u + s
}

// TestDaemonOutOfDescriptors: a daemon whose descriptors run out (its
// RLIMIT_NOFILE lowered to just above what it holds, then a box's
// connections to the egress proxy and the DNS forwarder take the rest)
// neither spins in its accept loops nor stops serving: it backs off, and
// when the box lets go it accepts again, at the same limit.
func TestDaemonOutOfDescriptors(t *testing.T) {
	d := startNetDaemon(t, "--net-pool", "0")
	ctx := ctxT(t, 5*time.Minute)
	attacker := createNet(t, ctx, d, &sbx.NetworkPolicy{Mode: "allow", AllowDomains: []string{"*.allowed.test"}})
	neighbour := createNet(t, ctx, d, &sbx.NetworkPolicy{Mode: "public"})
	pid := d.cmd.Process.Pid

	done := make(chan error, 1)
	go func() {
		res, err := attacker.RunShell(ctx, fmt.Sprintf("rm -f /tmp/attack-ready; /usr/bin/python3 - %s %s 300 60 2 5 <<'EOF'\n%s\nEOF", d.gateway, inetAllowed, emfilePy))
		if err == nil && res.Code != 0 {
			err = fmt.Errorf("exit %d: %s", res.Code, res.Stderr)
		}
		done <- err
	}()
	for {
		res, err := attacker.RunShell(ctx, "test -e /tmp/attack-ready")
		if err == nil && res.Code == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The attack's exec holds its own connection: from here on the
	// daemon needs no new descriptor for it.
	var orig unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &orig); err != nil {
		t.Fatal(err)
	}
	limit := uint64(fdCount(t, pid) + 20)
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: orig.Max}, nil); err != nil {
		t.Fatalf("lower the daemon's descriptor limit: %v", err)
	}
	restore := func() { _ = unix.Prlimit(pid, unix.RLIMIT_NOFILE, &orig, nil) }
	t.Cleanup(restore)

	// At the limit: the accept loops fail with EMFILE while connections
	// wait. Over two seconds the daemon must mostly sleep.
	deadline := time.Now().Add(20 * time.Second)
	for uint64(fdCount(t, pid)) < limit-1 {
		if time.Now().After(deadline) {
			t.Fatalf("the daemon's descriptors did not reach its lowered limit %d (at %d)", limit, fdCount(t, pid))
		}
		time.Sleep(10 * time.Millisecond)
	}
	start, t0 := cpuTicks(t, pid), time.Now()
	time.Sleep(2 * time.Second) // the measurement window, not a wait for a condition
	used := float64(cpuTicks(t, pid)-start) / 100 / time.Since(t0).Seconds()
	t.Logf("daemon CPU at its descriptor limit: %.0f%% of a core", used*100)
	if used > 0.3 {
		t.Errorf("the daemon used %.0f%% of a core while out of descriptors, want under 30%% (accept loops back off, not spin)", used*100)
	}

	if err := <-done; err != nil {
		t.Fatalf("attack: %v", err)
	}
	// The box let go: at the same lowered limit the daemon serves again
	// (new API connections, a TCP DNS query from the neighbour).
	deadline = time.Now().Add(30 * time.Second)
	for {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := sbx.NewClient(d.addr).List(lctx)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the API does not answer a new client 30s after the attack: %v", err)
		}
	}
	tcpDNS := fmt.Sprintf(`/usr/bin/python3 -c '
import socket, struct
q = struct.pack(">HHHHHH", 7, 0x0100, 1, 0, 0, 0) + b"\x06public\x04test\x00" + struct.pack(">HH", 1, 1)
s = socket.create_connection(("%s", 53), timeout=5)
s.sendall(struct.pack(">H", len(q)) + q)
n = struct.unpack(">H", s.recv(2))[0]
r = s.recv(n)
print("rcode", r[3] & 15, "answers", struct.unpack(">H", r[6:8])[0])
'`, d.gateway)
	// The test internet's resolver speaks UDP only, so the forwarder's
	// TCP answer is SERVFAIL (its upstream over TCP fails): any answer
	// shows the listener accepts and serves again.
	for {
		res, err := neighbour.RunShell(ctx, tcpDNS)
		if err == nil && res.Code == 0 && strings.HasPrefix(string(res.Stdout), "rcode ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the forwarder does not answer over TCP after the attack: %v %+v", err, res)
		}
		time.Sleep(100 * time.Millisecond)
	}
	restore()
}
