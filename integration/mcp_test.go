package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sbxdev/sbx/internal/tenant"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// mcpTools are the tools both MCP transports must list.
var mcpTools = []string{"create_code_context", "create_sandbox", "destroy_sandbox", "exec", "expose_port",
	"list_files", "list_sandboxes", "read_file", "run_code", "write_file"}

// mcpCall calls a tool and returns its result; a protocol error fails the test.
func mcpCall(t *testing.T, ctx context.Context, cs *mcp.ClientSession, name string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return res
}

// mcpText is the first text block of res.
func mcpText(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			return tc.Text
		}
	}
	t.Fatalf("got no text content in %+v", res.Content)
	return ""
}

// mcpJSON decodes the first text block of a successful res into v.
func mcpJSON(t *testing.T, name string, res *mcp.CallToolResult, v any) {
	t.Helper()
	text := mcpText(t, res)
	if res.IsError {
		t.Fatalf("%s: got tool error %q", name, text)
	}
	if err := json.Unmarshal([]byte(text), v); err != nil {
		t.Fatalf("%s: decoding %q: %v", name, text, err)
	}
}

// mcpSession drives one sandbox through every tool over cs, as an agent
// would, and returns the sandbox's id (destroyed unless keep).
func mcpSession(t *testing.T, ctx context.Context, cs *mcp.ClientSession, keep bool) string {
	t.Helper()
	tl, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tl.Tools {
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, mcpTools) {
		t.Errorf("got tools %v, want %v", names, mcpTools)
	}

	var sb struct{ ID, State string }
	mcpJSON(t, "create_sandbox", mcpCall(t, ctx, cs, "create_sandbox", map[string]any{}), &sb)
	if sb.ID == "" || sb.State != "running" {
		t.Fatalf("create_sandbox: got %+v, want a running sandbox", sb)
	}

	var ex struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
	}
	mcpJSON(t, "exec", mcpCall(t, ctx, cs, "exec", map[string]any{"sandbox": sb.ID, "command": "echo hello; echo oops >&2; exit 3"}), &ex)
	if ex.Stdout != "hello\n" || ex.Stderr != "oops\n" || ex.ExitCode != 3 {
		t.Errorf("exec: got %+v, want hello/oops/3", ex)
	}
	mcpJSON(t, "exec", mcpCall(t, ctx, cs, "exec", map[string]any{"sandbox": sb.ID, "command": "tr a-z A-Z", "stdin": "shout"}), &ex)
	if ex.Stdout != "SHOUT" || ex.ExitCode != 0 {
		t.Errorf("exec with stdin: got %+v, want SHOUT/0", ex)
	}

	// Output past the 1 MiB limit is read, counted and dropped.
	var big struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
		Dropped  int64  `json:"stdout_dropped_bytes"`
	}
	mcpJSON(t, "exec", mcpCall(t, ctx, cs, "exec", map[string]any{"sandbox": sb.ID, "command": "head -c 3000000 /dev/zero | tr '\\0' a"}), &big)
	if len(big.Stdout) != 1<<20 || big.Dropped != 3000000-1<<20 || big.ExitCode != 0 || strings.Trim(big.Stdout, "a") != "" {
		t.Errorf("exec of 3 MB: got %d bytes of stdout, %d dropped, exit %d; want %d, %d, 0", len(big.Stdout), big.Dropped, big.ExitCode, 1<<20, 3000000-1<<20)
	}

	res := mcpCall(t, ctx, cs, "write_file", map[string]any{"sandbox": sb.ID, "path": "/tmp/mcp/a.txt", "content": "written by mcp"})
	if res.IsError {
		t.Fatalf("write_file: %s", mcpText(t, res))
	}
	if got := mcpText(t, mcpCall(t, ctx, cs, "read_file", map[string]any{"sandbox": sb.ID, "path": "/tmp/mcp/a.txt"})); got != "written by mcp" {
		t.Errorf("read_file: got %q, want %q", got, "written by mcp")
	}
	var ls struct {
		Entries []struct{ Path, Type string } `json:"entries"`
	}
	mcpJSON(t, "list_files", mcpCall(t, ctx, cs, "list_files", map[string]any{"sandbox": sb.ID, "path": "/tmp/mcp"}), &ls)
	if len(ls.Entries) != 1 || ls.Entries[0].Type != "file" || !strings.HasSuffix(ls.Entries[0].Path, "a.txt") {
		t.Errorf("list_files: got %+v, want the one file a.txt", ls.Entries)
	}

	// A matplotlib figure comes back as PNG image content.
	res = mcpCall(t, ctx, cs, "run_code", map[string]any{"sandbox": sb.ID, "code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.show()\nprint('plotted')\n"})
	var rc struct {
		Stdout   string `json:"stdout"`
		ExitCode int    `json:"exit_code"`
	}
	mcpJSON(t, "run_code", res, &rc)
	if rc.Stdout != "plotted\n" || rc.ExitCode != 0 {
		t.Errorf("run_code: got %+v, want plotted/0", rc)
	}
	var pngs int
	for _, c := range res.Content {
		if img, ok := c.(*mcp.ImageContent); ok {
			if img.MIMEType != "image/png" || !bytes.HasPrefix(img.Data, []byte("\x89PNG\r\n\x1a\n")) {
				t.Errorf("run_code: got image %s starting %q, want a PNG", img.MIMEType, img.Data[:min(8, len(img.Data))])
			}
			pngs++
		}
	}
	if pngs != 1 {
		t.Errorf("run_code: got %d images, want 1", pngs)
	}
	// Other artifacts are embedded resources: a plotly figure's JSON; its
	// self-contained HTML (plotly.js inlined, over 8 MiB) is past the limit
	// of artifacts per call and left out with a note naming it.
	if hostHas("/usr/bin/python3", "-c", "import plotly") {
		res = mcpCall(t, ctx, cs, "run_code", map[string]any{"sandbox": sb.ID, "code": "import plotly.graph_objects as go\ngo.Figure(go.Bar(x=['a'], y=[1])).show()\n"})
		var gotJSON, leftOut bool
		for _, c := range res.Content {
			switch c := c.(type) {
			case *mcp.EmbeddedResource:
				gotJSON = gotJSON || c.Resource.MIMEType == plotlyMime && c.Resource.URI == "sbx://"+sb.ID+"/artifacts/plotly-1.plotly.json" &&
					strings.Contains(c.Resource.Text, `"type":"bar"`)
			case *mcp.TextContent:
				leftOut = leftOut || strings.Contains(c.Text, `artifact "plotly-1.html"`) && strings.Contains(c.Text, "left out")
			}
		}
		if !gotJSON || !leftOut {
			t.Errorf("run_code of a plotly figure: got the JSON resource %v, the HTML left out with a note %v; want both", gotJSON, leftOut)
		}
	}
	// A failing program is a tool error carrying its traceback.
	res = mcpCall(t, ctx, cs, "run_code", map[string]any{"sandbox": sb.ID, "code": "1/0"})
	if !res.IsError || !strings.Contains(mcpText(t, res), "ZeroDivisionError") {
		t.Errorf("run_code 1/0: got IsError %v %q, want a tool error naming ZeroDivisionError", res.IsError, mcpText(t, res))
	}

	// Bad input is a tool error naming what was wrong, not a crash.
	res = mcpCall(t, ctx, cs, "exec", map[string]any{"sandbox": sb.ID, "command": "true", "timeout_seconds": 100000})
	if !res.IsError || !strings.Contains(mcpText(t, res), "timeout_seconds") {
		t.Errorf("exec with a huge timeout: got IsError %v %q, want an error naming timeout_seconds", res.IsError, mcpText(t, res))
	}

	var list struct{ Sandboxes []struct{ ID string } }
	mcpJSON(t, "list_sandboxes", mcpCall(t, ctx, cs, "list_sandboxes", map[string]any{}), &list)
	if !slices.ContainsFunc(list.Sandboxes, func(s struct{ ID string }) bool { return s.ID == sb.ID }) {
		t.Errorf("list_sandboxes: got %+v, want it to hold %s", list.Sandboxes, sb.ID)
	}
	if !keep {
		if res := mcpCall(t, ctx, cs, "destroy_sandbox", map[string]any{"sandbox": sb.ID}); res.IsError {
			t.Fatalf("destroy_sandbox: %s", mcpText(t, res))
		}
	}
	return sb.ID
}

// TestMCPStdio drives `sbx mcp` with the MCP SDK's client over stdio: every
// tool works against a real daemon, and the sandboxes the session created
// and left are destroyed when the client goes away.
func TestMCPStdio(t *testing.T) {
	d := startDaemonToken(t, tenant.NewToken())
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.Command(d.bin, "--addr", d.url(), "mcp")
	cmd.Env = append(os.Environ(), "SBX_TOKEN="+d.token)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "sbx-test", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	mcpSession(t, ctx, cs, false)
	left := mcpSession(t, ctx, cs, true)
	if _, err := d.client().Get(ctx, left); err != nil {
		t.Fatalf("the kept sandbox before the session ends: %v", err)
	}
	// Closing the session ends `sbx mcp` (its stdin closes), which destroys
	// what the session left before exiting.
	if err := cs.Close(); err != nil {
		t.Logf("closing the session: %v", err)
	}
	if cmd.ProcessState == nil || !cmd.ProcessState.Exited() {
		t.Fatalf("sbx mcp is still running after the session closed (stderr %q)", stderr.String())
	}
	if _, err := d.client().Get(ctx, left); !sbx.IsNotFound(err) {
		t.Errorf("the session's sandbox after the session ended: got %v, want not found (stderr %q)", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), left) {
		t.Errorf("got stderr %q, want it to name the destroyed %s", stderr.String(), left)
	}

	// A client that stops the server with SIGTERM gets the same clean-up.
	cmd = exec.Command(d.bin, "--addr", d.url(), "mcp")
	cmd.Env = append(os.Environ(), "SBX_TOKEN="+d.token)
	cs, err = client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var sb struct{ ID string }
	mcpJSON(t, "create_sandbox", mcpCall(t, ctx, cs, "create_sandbox", map[string]any{}), &sb)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = cs.Close() // waits for the process to exit
	if _, err := d.client().Get(ctx, sb.ID); !sbx.IsNotFound(err) {
		t.Errorf("the sandbox of a session ended by SIGTERM: got %v, want not found", err)
	}
}

// TestMCPHTTP drives the daemon's /mcp endpoint (over TLS) with the MCP
// SDK's streamable-HTTP client: every tool works; without a token the endpoint
// answers 401; with tenants, one tenant's MCP client cannot see, run in,
// read or destroy another tenant's sandbox.
func TestMCPHTTP(t *testing.T) {
	dir := t.TempDir()
	tokA, tokB := tenant.NewToken(), tenant.NewToken()
	tenants := filepath.Join(dir, "tenants.json")
	if err := os.WriteFile(tenants, fmt.Appendf(nil, `{"tenants": [
		{"name": "acme", "tokens": [%q], "quotas": {"max_sandboxes": 4}},
		{"name": "beta", "tokens": [%q], "quotas": {"max_sandboxes": 4}}]}`,
		tenant.HashToken(tokA), tenant.HashToken(tokB)), 0o600); err != nil {
		t.Fatal(err)
	}
	// Over TLS: the endpoint's tools reach the daemon's listener pinning its
	// certificate.
	_, certFile, keyFile, pool := testCA(t, dir)
	tlsConf := &tls.Config{RootCAs: pool}
	d := startDaemonOpts(t, daemonOpts{token: tokA, tls: tlsConf}, "--tenants", tenants, "--tls-cert", certFile, "--tls-key", keyFile)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	endpoint := "https://" + d.addr + "/mcp"
	base := &http.Transport{TLSClientConfig: tlsConf}
	defer base.CloseIdleConnections()
	connect := func(tok string) (*mcp.ClientSession, error) {
		hc := &http.Client{Transport: &bearerRT{tok: tok, base: base}}
		client := mcp.NewClient(&mcp.Implementation{Name: "sbx-test", Version: "1"}, nil)
		return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc}, nil)
	}

	// No token, or a wrong one: refused before any MCP is spoken.
	for _, tok := range []string{"", "wrong"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := (&http.Client{Transport: base}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("POST /mcp with token %q: got status %d, want 401", tok, resp.StatusCode)
		}
	}

	// Behind a reverse proxy on the same host (its own Host header, to the
	// loopback listener): a token is required, so it is served.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))
	req.Host = "sbx.example.com"
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+tokA)
	resp, err := (&http.Client{Transport: base}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"serverInfo"`) {
		t.Errorf("initialize with Host sbx.example.com: got %d %q, want 200 with serverInfo", resp.StatusCode, body)
	}

	a, err := connect(tokA)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	mcpSession(t, ctx, a, false)
	boxA := mcpSession(t, ctx, a, true)

	b, err := connect(tokB)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var list struct{ Sandboxes []struct{ ID string } }
	mcpJSON(t, "list_sandboxes", mcpCall(t, ctx, b, "list_sandboxes", map[string]any{}), &list)
	if len(list.Sandboxes) != 0 {
		t.Errorf("beta's list_sandboxes: got %+v, want none (acme's are acme's)", list.Sandboxes)
	}
	for _, call := range []struct {
		tool string
		args map[string]any
	}{
		{"exec", map[string]any{"sandbox": boxA, "command": "echo pwned"}},
		{"run_code", map[string]any{"sandbox": boxA, "code": "print('pwned')"}},
		{"read_file", map[string]any{"sandbox": boxA, "path": "/tmp/mcp/a.txt"}},
		{"write_file", map[string]any{"sandbox": boxA, "path": "/tmp/pwned", "content": "x"}},
		{"list_files", map[string]any{"sandbox": boxA, "path": "/tmp"}},
		{"expose_port", map[string]any{"sandbox": boxA, "port": 8080}},
		{"destroy_sandbox", map[string]any{"sandbox": boxA}},
	} {
		res := mcpCall(t, ctx, b, call.tool, call.args)
		if text := mcpText(t, res); !res.IsError || !strings.Contains(text, "not_found") {
			t.Errorf("beta's %s on acme's sandbox: got IsError %v %q, want a not_found tool error", call.tool, res.IsError, text)
		}
	}
	// acme's sandbox is untouched by all that.
	var ex struct {
		Stdout string `json:"stdout"`
	}
	mcpJSON(t, "exec", mcpCall(t, ctx, a, "exec", map[string]any{"sandbox": boxA, "command": "cat /tmp/mcp/a.txt; ls /tmp/pwned 2>&1 || true"}), &ex)
	if !strings.HasPrefix(ex.Stdout, "written by mcp") || !strings.Contains(ex.Stdout, "No such file") {
		t.Errorf("acme's sandbox after beta's calls: got %q, want its file and no /tmp/pwned", ex.Stdout)
	}
	if res := mcpCall(t, ctx, a, "destroy_sandbox", map[string]any{"sandbox": boxA}); res.IsError {
		t.Fatalf("destroy_sandbox: %s", mcpText(t, res))
	}
}

// bearerRT sends a bearer token on every request.
type bearerRT struct {
	tok  string
	base http.RoundTripper
}

func (r *bearerRT) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+r.tok)
	return r.base.RoundTrip(req)
}
