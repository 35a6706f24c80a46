package integration

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestGvisorNetwork: sandboxes on the gvisor runtime join the daemon's
// network like oci ones, with gVisor's netstack over the veth (runsc
// --network=sandbox): the public mode reaches the internet and resolves
// through the daemon's DNS forwarder but no private range, host service or
// neighbour; allow-lists are enforced by address and by domain; none has
// loopback only; the port proxy reaches a server in the box; domain
// secrets go through the egress proxy; a scoped token reaches the box API
// on the gateway; a policy change applies in place,
// while switching a running box to or from none is refused by capability
// (runsc reads the namespace's interfaces once); destroying leaves nothing.
func TestGvisorNetwork(t *testing.T) {
	runsc := runscForTests(t)
	d := startEgressDaemon(t, "--runsc", runsc)
	ctx := ctxT(t, 5*time.Minute)
	in := d.inet
	out, _, code := d.cli("", "info")
	if caps := runtimeCaps(out, "gvisor"); code != 0 || !slices.Contains(caps, "network") || slices.Contains(caps, "network-replug") {
		t.Fatalf("sbx info: exit %d, gvisor capabilities %q; want network and not network-replug\n%s", code, caps, out)
	}

	for _, a := range []string{d.gateway, in.hostAddr} {
		ln, err := net.Listen("tcp", a+":8081")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() { _ = http.Serve(ln, echoHandler("the host")) }()
	}
	create := func(p *sbx.NetworkPolicy, cmd ...string) *sbx.Sandbox {
		t.Helper()
		sb, err := d.client().Create(ctx, sbx.CreateOptions{Runtime: "gvisor", Network: p, Command: cmd})
		if err != nil {
			t.Fatalf("create on gvisor with %+v: %v", p, err)
		}
		d.remember(sb.ID)
		if k := mustRun(t, ctx, sb, "cat /proc/version"); !strings.Contains(k, "gvisor") {
			t.Fatalf("/proc/version = %q, want gVisor's kernel", k)
		}
		return sb
	}

	pub := create(nil)
	other := create(nil, "python3", "-m", "http.server", "8000")
	if pub.Info.GetNetwork().GetMode() != sbxv1.NetworkMode_NETWORK_MODE_PUBLIC || pub.Info.GetIpAddress() == "" {
		t.Fatalf("default network on gvisor: %v %q, want public with an address", pub.Info.GetNetwork(), pub.Info.GetIpAddress())
	}

	t.Run("public", func(t *testing.T) {
		if !reach(t, ctx, pub, in.public) {
			t.Errorf("public gvisor box cannot reach %s", in.public)
		}
		if got := resolve(t, ctx, pub, "public.test"); got != in.public {
			t.Errorf("public.test resolves to %q, want %s", got, in.public)
		}
		if got := mustRun(t, ctx, pub, "cat /etc/resolv.conf"); got != "nameserver "+d.gateway+"\n" {
			t.Errorf("resolv.conf = %q", got)
		}
		for _, a := range []string{in.private, in.cgnat, in.metadata, d.gateway + ":8081", in.hostAddr + ":8081",
			d.gateway + ":" + strings.Split(d.addr, ":")[1]} {
			if reach(t, ctx, pub, a) {
				t.Errorf("public gvisor box reaches %s", a)
			}
		}
		waitServes(t, ctx, other, "127.0.0.1:8000")
		if reach(t, ctx, pub, other.Info.GetIpAddress()+":8000") {
			t.Error("one gvisor sandbox reaches another")
		}
		if got := mustRun(t, ctx, pub, ifaces); got != "eth0 lo " {
			t.Errorf("interfaces of a public gvisor box: %q, want eth0 and lo", got)
		}
		for _, cmd := range []string{"ip link set eth0 down", "ip addr add 10.215.0.99/24 dev eth0", "ip route del default"} {
			if res, err := pub.RunShell(ctx, cmd); err != nil || res.Code == 0 {
				t.Errorf("%q in the gvisor box: err %v, exit %d; want a failure", cmd, err, res.Code)
			}
		}
		if !reach(t, ctx, pub, in.public) {
			t.Error("lost connectivity after the reconfiguration attempts")
		}
		if err := pub.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		if st := pub.Info.GetStats(); st.GetNetTxBytes() == 0 || st.GetNetRxBytes() == 0 {
			t.Errorf("stats %v: want traffic counted", st)
		}
	})

	t.Run("port proxy", func(t *testing.T) {
		waitServes(t, ctx, other, "127.0.0.1:8000")
		u, err := other.PortURL(ctx, 8000)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.Get(u)
		if err != nil {
			t.Fatalf("GET %s: %v", u, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), "Directory listing") {
			t.Errorf("GET %s through the port proxy: %d %q, want the box's directory listing", u, resp.StatusCode, body)
		}
	})

	t.Run("none", func(t *testing.T) {
		sb := create(&sbx.NetworkPolicy{Mode: "none"})
		if sb.Info.GetIpAddress() != "" {
			t.Errorf("none box has address %q", sb.Info.GetIpAddress())
		}
		if got := mustRun(t, ctx, sb, ifaces); got != "lo " {
			t.Errorf("interfaces of a none gvisor box: %q, want lo only", got)
		}
		for _, a := range []string{in.public, d.gateway + ":8081"} {
			if reach(t, ctx, sb, a) {
				t.Errorf("none gvisor box reaches %s", a)
			}
		}
		err := sb.UpdateNetwork(ctx, sbx.NetworkPolicy{Mode: "public"})
		if !sbx.IsFailedPrecondition(err) || !strings.Contains(err.Error(), `runtime "gvisor"`) || !strings.Contains(err.Error(), `"network-replug"`) {
			t.Errorf("switching a gvisor box from none to public: got %v, want FailedPrecondition naming the runtime and \"network-replug\"", err)
		}
		if reach(t, ctx, sb, in.public) {
			t.Errorf("none gvisor box reaches %s after the refused switch", in.public)
		}
	})

	t.Run("allow-cidr", func(t *testing.T) {
		sb := create(&sbx.NetworkPolicy{Mode: "allow", AllowCIDRs: []string{in.public + "/32"}})
		if !reach(t, ctx, sb, in.public) {
			t.Errorf("cannot reach the allowed %s", in.public)
		}
		for _, a := range []string{in.allowed, in.blocked, in.private, in.metadata, d.gateway + ":8081"} {
			if reach(t, ctx, sb, a) {
				t.Errorf("allow-cidr gvisor box reaches %s", a)
			}
		}
	})

	t.Run("allow-domains", func(t *testing.T) {
		sb := create(&sbx.NetworkPolicy{Mode: "allow", AllowDomains: []string{"*.allowed.test"}})
		if got := resolve(t, ctx, sb, "a.allowed.test"); got != in.allowed {
			t.Errorf("a.allowed.test resolves to %q, want %s", got, in.allowed)
		}
		if !reach(t, ctx, sb, "a.allowed.test") {
			t.Error("cannot reach a.allowed.test")
		}
		if got := resolve(t, ctx, sb, "blocked.test"); got != "" {
			t.Errorf("blocked.test resolves to %q", got)
		}
		for _, a := range []string{in.blocked, in.public} {
			if reach(t, ctx, sb, a) {
				t.Errorf("allow-domains gvisor box reaches %s by address", a)
			}
		}
	})

	t.Run("policy change in place", func(t *testing.T) {
		sb := create(nil)
		if !reach(t, ctx, sb, in.public) {
			t.Fatalf("cannot reach %s before the change", in.public)
		}
		if err := sb.UpdateNetwork(ctx, sbx.NetworkPolicy{Mode: "allow", AllowCIDRs: []string{in.allowed + "/32"}}); err != nil {
			t.Fatal(err)
		}
		if reach(t, ctx, sb, in.public) || !reach(t, ctx, sb, in.allowed) {
			t.Errorf("after allowing only %s: reaches %s, or not %s", in.allowed, in.public, in.allowed)
		}
		err := sb.UpdateNetwork(ctx, sbx.NetworkPolicy{Mode: "none"})
		if !sbx.IsFailedPrecondition(err) || !strings.Contains(err.Error(), `"network-replug"`) {
			t.Errorf("switching a gvisor box to none: got %v, want FailedPrecondition naming \"network-replug\"", err)
		}
		if !reach(t, ctx, sb, in.allowed) {
			t.Error("lost the allowed address after the refused switch")
		}
	})

	t.Run("domain secrets", func(t *testing.T) {
		const value = "sk-gvisor-e2e-Value"
		sb, err := d.client().Create(ctx, sbx.CreateOptions{Runtime: "gvisor", DomainSecrets: []sbx.DomainSecret{
			{Name: "API_KEY", Value: value, Domains: []string{"api.secret.test"}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		d.remember(sb.ID)
		got := mustRun(t, ctx, sb, `curl -sS --max-time 5 -H "Authorization: Bearer $API_KEY" https://api.secret.test/`)
		if !strings.HasPrefix(got, "hello from "+inetPublic+"\n") || !strings.Contains(got, "\nauth=Bearer "+value+"\n") {
			t.Errorf("https://api.secret.test/ from the gvisor box: got %q, want the server to see the secret's value", got)
		}
		if env := mustRun(t, ctx, sb, "env"); strings.Contains(env, value) {
			t.Errorf("the gvisor box's env shows the secret's value:\n%s", env)
		}
	})

	t.Run("scoped token", func(t *testing.T) {
		sb, err := d.client().Create(ctx, sbx.CreateOptions{Runtime: "gvisor", ScopedToken: true})
		if err != nil {
			t.Fatal(err)
		}
		d.remember(sb.ID)
		// The box reaches the daemon's box API on the gateway and its token
		// is accepted: a box it did not create is not_found to it.
		out := mustRun(t, ctx, sb, `curl -sS --max-time 5 -H "Authorization: Bearer $SBX_TOKEN" -H 'Content-Type: application/json' `+
			`-d '{"sandbox":"`+pub.ID+`"}' "$SBX_ADDR/sbx.v1.SandboxService/GetSandbox"`)
		if !strings.Contains(out, `"not_found"`) {
			t.Errorf("GetSandbox of another box with the gvisor box's scoped token: got %s, want not_found", out)
		}
	})

	t.Run("destroy leaves nothing", func(t *testing.T) {
		sb := create(&sbx.NetworkPolicy{Mode: "allow", AllowDomains: []string{"*.allowed.test"}})
		var name, veth, ip string
		for _, s := range d.state(t).Slots {
			if s.Owner == sb.ID {
				name, veth, ip = s.Name, s.Veth, s.IP
			}
		}
		if name == "" || !linkExists(veth) || len(nftElementsOf(t, d.table, ip)) == 0 {
			t.Fatalf("slot %q veth %q address %q: not set up", name, veth, ip)
		}
		if err := sb.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
		d.waitNetGone(t, sb.ID, name, veth, ip)
	})

	list, err := d.client().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		if err := sb.Destroy(ctx); err != nil {
			t.Errorf("destroy %s: %v", sb.ID, err)
		}
	}
	d.assertNoLeaks()
}

// runtimeCaps returns the capabilities `sbx info` lists for runtime name.
func runtimeCaps(info, name string) []string {
	lines := strings.Split(info, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "runtime "+name+":") || strings.HasPrefix(l, "runtime "+name+" (default):") {
			if i+1 < len(lines) {
				if c, ok := strings.CutPrefix(strings.TrimSpace(lines[i+1]), "capabilities: "); ok {
					return strings.Split(c, ", ")
				}
			}
		}
	}
	return nil
}

// ifaces lists the box's network interfaces, sorted, space-separated
// (gVisor has no /sys/class/net without a network device).
const ifaces = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ' '"

// waitServes waits up to 20 s for the box to fetch http://addr/ itself.
func waitServes(t *testing.T, ctx context.Context, sb *sbx.Sandbox, addr string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !reach(t, ctx, sb, addr) {
		if time.Now().After(deadline) {
			t.Fatalf("the server at %s in sandbox %s did not come up in 20s", addr, sb.ID)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestGvisorWarmPoolNetwork: with gvisor as the default runtime, warm boxes
// start connected (public) and are handed to connected creates, but never
// to a create asking for network mode none: gVisor's netstack would keep
// the veth it read at start (the warm box's eth0) after the daemon unplugs
// it, so the box must be made cold, with lo only. A gvisor box keeps its
// network across a daemon kill -9.
func TestGvisorWarmPoolNetwork(t *testing.T) {
	runsc := runscForTests(t)
	d := startNetDaemon(t, "--runsc", runsc, "--default-runtime", "gvisor", "--warm-pool", "1")
	ctx := ctxT(t, 3*time.Minute)
	d.waitLog(t, "warm pool: box ready", 1)
	none, err := d.client().Create(ctx, sbx.CreateOptions{Network: &sbx.NetworkPolicy{Mode: "none"}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(none.ID)
	if got := mustRun(t, ctx, none, ifaces); got != "lo " {
		t.Errorf("interfaces of a none gvisor box created with a warm pool: %q, want lo only", got)
	}
	if reach(t, ctx, none, d.inet.public) {
		t.Errorf("none gvisor box reaches %s", d.inet.public)
	}
	if n := d.logCount("warm pool: box taken"); n != 0 {
		t.Errorf("the none create took a warm box (%d taken)", n)
	}
	pub, err := d.client().Create(ctx, sbx.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(pub.ID)
	if n := d.logCount("warm pool: box taken"); n != 1 {
		t.Errorf("the public create took %d warm boxes, want 1", n)
	}
	if pub.Info.GetRuntime() != "gvisor" || !reach(t, ctx, pub, d.inet.public) {
		t.Errorf("public sandbox on the default gvisor runtime (runtime %q) cannot reach %s", pub.Info.GetRuntime(), d.inet.public)
	}

	d.kill9()
	d.start()
	again, err := d.client().Get(ctx, pub.ID)
	if err != nil {
		t.Fatalf("get after restart: %v", err)
	}
	if !reach(t, ctx, again, d.inet.public) {
		t.Errorf("gvisor box cannot reach %s after a daemon kill -9", d.inet.public)
	}
	d.stop()
	d.args = append(d.args, "--warm-pool", "0")
	d.start()
	for _, id := range []string{none.ID, pub.ID} {
		sb, err := d.client().Get(ctx, id)
		if err == nil {
			err = sb.Destroy(ctx)
		}
		if err != nil {
			t.Errorf("destroy %s: %v", id, err)
		}
	}
	d.assertNoLeaks()
}

// logCount counts the daemon log's lines containing msg.
func (d *netDaemon) logCount(msg string) int {
	b, _ := os.ReadFile(filepath.Join(d.dataDir, "daemon.log"))
	return strings.Count(string(b), msg)
}

// waitLog waits up to 30 s for the daemon to have logged msg n times.
func (d *netDaemon) waitLog(t *testing.T, msg string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for d.logCount(msg) < n {
		if time.Now().After(deadline) {
			t.Fatalf("the daemon did not log %q %d times in 30s", msg, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
