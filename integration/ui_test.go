package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// originWideServer answers every GET with headers that act on a whole
// origin (and one that does not).
const originWideServer = `
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Service-Worker-Allowed", "/")
        self.send_header("Clear-Site-Data", '"*"')
        self.send_header("X-App", "kept")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), H).serve_forever()
`

// TestUIProxyAndTerminal: against a real daemon and sandbox, (1) a sandbox
// page proxied by path, which shares the API listener's origin with other
// sandboxes' pages, cannot send Service-Worker-Allowed (a service worker
// over "/" would capture them) or Clear-Site-Data, while its other headers
// pass and host routing (its own origin) is untouched; (2) the dashboard's
// terminal WebSocket, on the dashboard's own listener, runs an interactive
// shell in the sandbox for the right token only, and only for the
// dashboard's own Origin: not a foreign site's, not the API listener's
// (where sandboxes' pages are), and the API listener serves no terminal.
func TestUIProxyAndTerminal(t *testing.T) {
	uiAddr := freeAddr(t)
	d := startDaemonToken(t, portToken, "--proxy-domain", "sbx.test", "--ui-listen", uiAddr)
	ctx := ctxT(t, 2*time.Minute)
	sb, err := d.client().Create(ctx, sbx.CreateOptions{Command: []string{"/usr/bin/python3", "-c", originWideServer}, MemoryBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	defer sb.Destroy(context.Background()) //nolint:errcheck
	for deadline := time.Now().Add(30 * time.Second); ; {
		ports, err := sb.Ports(ctx)
		if err != nil {
			t.Fatalf("list ports: %v", err)
		}
		if slices.ContainsFunc(ports, func(p sbx.Port) bool { return p.Port == 8000 }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the test server did not listen in 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	auth := map[string]string{"Authorization": "Bearer " + portToken}
	base := "http://" + d.url() // d.url() has no scheme without TLS

	t.Run("origin-wide headers", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			url    string
			host   string
			stripd bool
		}{
			{"path", base + "/proxy/" + sb.ID + "/8000/", "", true},
			{"host", base + "/", "8000-" + sb.ID + ".sbx.test", false},
		} {
			hdr := map[string]string{"Authorization": auth["Authorization"]}
			if tc.host != "" {
				hdr["Host"] = tc.host
			}
			resp, body := do(t, newReq(t, "GET", tc.url, hdr))
			if resp.StatusCode != 200 || body != "ok" {
				t.Fatalf("%s: got %d %q, want 200 ok", tc.name, resp.StatusCode, body)
			}
			for _, k := range []string{"Service-Worker-Allowed", "Clear-Site-Data"} {
				if got := resp.Header.Get(k) != ""; got == tc.stripd {
					t.Errorf("%s routing: %s present = %v, want %v", tc.name, k, got, !tc.stripd)
				}
			}
			if got := resp.Header.Get("X-App"); got != "kept" {
				t.Errorf("%s routing: got X-App %q, want kept", tc.name, got)
			}
		}
	})

	wsURL := "ws://" + uiAddr + "/ui/exec"
	dash := "http://" + uiAddr
	dial := func(origin string) (*websocket.Conn, *http.Response, error) {
		return websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {origin}}})
	}
	hello := func(tok string) []byte {
		b, _ := json.Marshal(map[string]any{"token": tok, "sandbox": sb.ID, "cols": 80, "rows": 24})
		return b
	}

	t.Run("terminal refusals", func(t *testing.T) {
		for _, origin := range []string{"http://evil.test", base, "null"} {
			if c, resp, err := dial(origin); err == nil {
				c.CloseNow() //nolint:errcheck
				t.Fatalf("Origin %s got a terminal", origin)
			} else if resp == nil || resp.StatusCode != http.StatusForbidden {
				t.Fatalf("Origin %s: got %v, want 403", origin, resp)
			}
		}
		if c, _, err := websocket.Dial(ctx, "ws://"+d.url()+"/ui/exec", &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {base}}}); err == nil {
			c.CloseNow() //nolint:errcheck
			t.Fatal("the API listener served a terminal")
		}
		c, _, err := dial(dash)
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow() //nolint:errcheck
		if err := c.Write(ctx, websocket.MessageText, hello("wrong-token")); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.Read(ctx); websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
			t.Fatalf("a wrong token: got %v, want close %d", err, websocket.StatusPolicyViolation)
		}
	})

	t.Run("terminal", func(t *testing.T) {
		c, _, err := dial(dash)
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow() //nolint:errcheck
		if err := c.Write(ctx, websocket.MessageText, hello(portToken)); err != nil {
			t.Fatal(err)
		}
		if err := c.Write(ctx, websocket.MessageBinary, []byte("echo hi$((6*7))\nexit 3\n")); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		for {
			typ, data, err := c.Read(ctx)
			if err != nil {
				t.Fatalf("reading the terminal: %v (output so far %q)", err, out.String())
			}
			if typ == websocket.MessageBinary {
				out.Write(data)
				continue
			}
			var msg struct {
				Exited *struct {
					ExitCode int `json:"exitCode"`
				} `json:"exited"`
				Error string `json:"error"`
			}
			if err := json.Unmarshal(data, &msg); err != nil || msg.Exited == nil {
				t.Fatalf("control message %q: want exited", data)
			}
			if msg.Exited.ExitCode != 3 {
				t.Errorf("got exit code %d, want 3", msg.Exited.ExitCode)
			}
			break
		}
		// The PTY echoes the input; the command's own output is hi42 on a line.
		if o := out.String(); !strings.Contains(o, "\nhi42\r\n") && !strings.Contains(o, "\rhi42\r\n") {
			t.Errorf("terminal output %q: want a line hi42", out.String())
		}
	})
}
