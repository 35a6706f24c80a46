package integration

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/coder/websocket"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// pageServer serves, at /, a page whose script calls the daemon's API on
// its own origin (the API listener, where path-proxied pages are served)
// without any token: it lists the sandboxes and makes /tmp/pwned in every
// one. It writes the outcome into the page (read back with --dump-dom).
const pageServer = `
import http.server
PAGE = b"""<!doctype html><html><body><pre id=out>running</pre><script>
(async () => {
  const out = document.getElementById("out");
  try {
    const call = async (m, body) => {
      const r = await fetch("/sbx.v1.SandboxService/" + m, {method: "POST",
        headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
      const t = await r.text();
      if (!r.ok) throw new Error(m + ": " + r.status + " " + t);
      return JSON.parse(t);
    };
    const l = await call("ListSandboxes", {});
    for (const s of l.sandboxes || []) await call("MakeDir", {sandbox: s.id, path: "/tmp/pwned"});
    out.textContent = "ATTACK-DONE " + (l.sandboxes || []).length;
  } catch (e) { out.textContent = "ATTACK-REFUSED " + e; }
})();
</script></body></html>"""
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), H).serve_forever()
`

// TestBrowserCannotDriveOpenAPI: a daemon without a token (the default, on
// loopback) trusts whoever reaches it; a browser is not such a client. (1)
// A sandbox's page, opened by path in a real browser (Debian's chromium,
// headless), shares the API listener's origin, and its script calls the
// API there with no token: it must be refused, and the victim sandbox
// must not gain /tmp/pwned (on the old code the page listed the sandboxes
// and wrote into every one). (2) A page on another site whose name is
// rebound to 127.0.0.1 (DNS rebinding) sends its own name as Host and
// Origin: the API, the dashboard's API and the dashboard's terminal must
// refuse it. (3) The CLI/SDK (no Origin) and the dashboard's own page
// (Origin = its listener) still work.
func TestBrowserCannotDriveOpenAPI(t *testing.T) {
	chromium := "/usr/bin/chromium"
	if _, err := os.Stat(chromium); err != nil {
		t.Skipf("no %s: %v", chromium, err)
	}
	uiAddr := freeAddr(t)
	d := startDaemon(t, "--ui-listen", uiAddr)
	ctx := ctxT(t, 3*time.Minute)
	c := d.client()
	victim, err := c.Create(ctx, sbx.CreateOptions{Command: []string{"sleep", "infinity"}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(victim.ID)
	defer victim.Destroy(context.Background()) //nolint:errcheck
	attacker, err := c.Create(ctx, sbx.CreateOptions{Command: []string{"/usr/bin/python3", "-c", pageServer}, MemoryBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(attacker.ID)
	defer attacker.Destroy(context.Background()) //nolint:errcheck
	for deadline := time.Now().Add(30 * time.Second); ; {
		ports, err := attacker.Ports(ctx)
		if err != nil {
			t.Fatalf("list ports: %v", err)
		}
		if slices.ContainsFunc(ports, func(p sbx.Port) bool { return p.Port == 8000 }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the attacker's page server did not listen in 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}

	t.Run("sandbox page", func(t *testing.T) {
		page := "http://" + d.url() + "/proxy/" + attacker.ID + "/8000/"
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		out, err := exec.CommandContext(cctx, chromium, "--headless", "--no-sandbox", "--disable-gpu",
			"--user-data-dir="+t.TempDir(), "--virtual-time-budget=15000", "--dump-dom", page).Output()
		if err != nil {
			t.Fatalf("chromium: %v", err)
		}
		dom := string(out)
		if !strings.Contains(dom, `id="out">ATTACK-`) {
			t.Fatalf("the page's script did not finish: %s", tail(dom, 2000))
		}
		if strings.Contains(dom, `id="out">ATTACK-DONE`) {
			t.Errorf("a sandbox's page called the API on its own origin: %s", tail(dom, 500))
		}
		if _, err := victim.Stat(ctx, "/tmp/pwned"); err == nil {
			t.Errorf("the sandbox's page made /tmp/pwned in the victim sandbox %s", victim.ID)
		} else if connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("stat the victim's /tmp/pwned: %v", err)
		}
	})

	list := func(base, host, origin string, routed bool) int {
		hdr := map[string]string{"Content-Type": "application/json"}
		if routed { // envd's process start in the victim, routed as the E2B SDKs do
			hdr["E2b-Sandbox-Id"], hdr["E2b-Sandbox-Port"] = victim.ID, "49983"
		}
		if host != "" {
			hdr["Host"] = host
		}
		if origin != "" {
			hdr["Origin"] = origin
		}
		req, err := http.NewRequest("POST", base+"/sbx.v1.SandboxService/ListSandboxes", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			if k == "Host" {
				req.Host = v
			} else {
				req.Header.Set(k, v)
			}
		}
		resp, _ := do(t, req)
		return resp.StatusCode
	}
	api, ui := "http://"+d.url(), "http://"+uiAddr
	_, apiPort, _ := strings.Cut(d.url(), ":")
	_, uiPort, _ := strings.Cut(uiAddr, ":")

	t.Run("rebinding and origins", func(t *testing.T) {
		for _, tc := range []struct {
			name         string
			base         string
			host, origin string
			want         int
			routed       bool
		}{
			{"cli", api, "", "", 200, false},
			{"cli by localhost", api, "localhost:" + apiPort, "", 200, false},
			{"dashboard page", ui, "", ui, 200, false},
			{"dashboard page by localhost", ui, "localhost:" + uiPort, "http://localhost:" + uiPort, 200, false},
			{"sandbox page origin on API", api, "", api, 403, false},
			{"foreign origin on API", api, "", "http://evil.test", 403, false},
			{"rebound name on API", api, "rebind.evil.test:" + apiPort, "http://rebind.evil.test:" + apiPort, 403, false},
			{"rebound name on API, no Origin", api, "rebind.evil.test:" + apiPort, "", 403, false},
			{"rebound name on dashboard", ui, "rebind.evil.test:" + uiPort, "http://rebind.evil.test:" + uiPort, 403, false},
			{"rebound name with trailing dot on dashboard", ui, "localhost.evil.test.:" + uiPort, "http://localhost.evil.test.:" + uiPort, 403, false},
			{"sandbox page to another box's envd by headers", api, "", api, 403, true},
			{"foreign page to the dashboard's API", ui, "", api, 403, false},
		} {
			if got := list(tc.base, tc.host, tc.origin, tc.routed); got != tc.want {
				t.Errorf("%s (Host %q, Origin %q): got %d, want %d", tc.name, tc.host, tc.origin, got, tc.want)
			}
		}
	})

	t.Run("rebound terminal", func(t *testing.T) {
		host := "rebind.evil.test:" + uiPort
		wc, resp, err := websocket.Dial(ctx, "ws://"+uiAddr+"/ui/exec", &websocket.DialOptions{
			Host: host, HTTPHeader: http.Header{"Origin": {"http://" + host}}})
		if err == nil {
			wc.CloseNow() //nolint:errcheck
			t.Fatal("a rebound page (Host and Origin its own name) got the dashboard's terminal")
		}
		if resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Fatalf("a rebound terminal: got %v, want 403", resp)
		}
	})
}
