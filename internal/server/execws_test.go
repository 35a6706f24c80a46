package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestExecWSRefusals: the terminal WebSocket refuses another site's page
// (Origin check, before any upgrade) and a wrong or missing token (closed
// with 1008 after the hello, before any exec), and the dashboard's files
// are served without a token while the API still wants one.
func TestExecWSRefusals(t *testing.T) {
	ui := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("dashboard")) })
	f := NewFront(http.NotFoundHandler(), nil, FrontConfig{Token: "s3cret"})
	defer f.Close()
	srv := httptest.NewServer(f.Dashboard(ui))
	defer srv.Close()
	wsURL := "ws" + strings.TrimPrefix(srv.URL, "http") + ExecWSPath
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	t.Run("foreign origin", func(t *testing.T) {
		h := http.Header{"Origin": {"https://evil.example"}}
		c, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: h})
		if err == nil {
			c.CloseNow() //nolint:errcheck
			t.Fatal("dial from a foreign origin: got a connection, want a refusal")
		}
		if resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Fatalf("dial from a foreign origin: got %v, want 403", resp)
		}
	})
	for _, tc := range []struct{ name, hello string }{
		{"wrong token", `{"token":"nope","sandbox":"x"}`},
		{"no token", `{"sandbox":"x"}`},
		{"not json", `hello`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{"Origin": {srv.URL}}
			c, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: h})
			if err != nil {
				t.Fatalf("dial from our own origin: %v", err)
			}
			defer c.CloseNow() //nolint:errcheck
			if err := c.Write(ctx, websocket.MessageText, []byte(tc.hello)); err != nil {
				t.Fatal(err)
			}
			_, _, err = c.Read(ctx)
			if got := websocket.CloseStatus(err); got != websocket.StatusPolicyViolation {
				t.Fatalf("after hello %s: got close status %d (%v), want %d", tc.hello, got, err, websocket.StatusPolicyViolation)
			}
		})
	}
	for _, tc := range []struct {
		path string
		want int
	}{
		{"/ui/", http.StatusOK},
		{"/ui/assets/x.js", http.StatusOK},
		{"/sbx.v1.SandboxService/ListSandboxes", http.StatusUnauthorized},
		{"/exec", http.StatusUnauthorized},
		{"/proxy/box/8000/", http.StatusNotFound},
	} {
		resp, err := http.Get(srv.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("GET %s without a token: got %d, want %d", tc.path, resp.StatusCode, tc.want)
		}
	}
}

// TestExecWSTenancy: the dashboard's terminal follows the ExecInteractive
// RPC's tenancy rules: a tenant's shell runs in its own sandbox; another
// tenant and a scoped token are told exactly what a missing sandbox gets;
// the admin token runs nothing; a scoped token reaches its child.
func TestExecWSTenancy(t *testing.T) {
	e := newTenancyEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const missing = "sb-nosuchbox000"
	wsURL := "ws" + strings.TrimPrefix(e.dash.URL, "http") + ExecWSPath
	// run runs `exit 7` and returns "exit N", or the error the daemon sent.
	run := func(tok, box string) string {
		c, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {e.dash.URL}}})
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer c.CloseNow() //nolint:errcheck
		hello, _ := json.Marshal(map[string]any{"token": tok, "sandbox": box, "cols": 80, "rows": 24, "argv": []string{"sh", "-c", "exit 7"}})
		if err := c.Write(ctx, websocket.MessageText, hello); err != nil {
			t.Fatal(err)
		}
		for {
			typ, data, err := c.Read(ctx)
			if err != nil {
				return fmt.Sprintf("closed %d", websocket.CloseStatus(err))
			}
			if typ != websocket.MessageText {
				continue
			}
			var msg struct {
				Exited *struct {
					ExitCode int `json:"exitCode"`
				} `json:"exited"`
				Error string `json:"error"`
			}
			if err := json.Unmarshal(data, &msg); err != nil {
				t.Fatalf("control message %q: %v", data, err)
			}
			if msg.Exited != nil {
				return fmt.Sprintf("exit %d", msg.Exited.ExitCode)
			}
			return "error: " + msg.Error
		}
	}
	if got := run(e.tokA, e.boxA); got != "exit 7" {
		t.Fatalf("acme in its box: got %q, want exit 7", got)
	}
	if got := run(e.scoped, e.child); got != "exit 7" {
		t.Errorf("scoped token in its child: got %q, want exit 7", got)
	}
	for who, tok := range map[string]string{"beta": e.tokB, "scoped": e.scoped} {
		want := strings.ReplaceAll(run(tok, missing), missing, e.boxA)
		if got := run(tok, e.boxA); got != want || !strings.Contains(got, "not found") {
			t.Errorf("%s in acme's box: got %q, want %q (as for a missing sandbox)", who, got, want)
		}
	}
	if got := run(e.admin, e.boxA); !strings.Contains(got, "admin token") {
		t.Errorf("admin token in acme's box: got %q, want a refusal naming the admin token", got)
	}
	if got := run("nope", e.boxA); got != fmt.Sprintf("closed %d", websocket.StatusPolicyViolation) {
		t.Errorf("a wrong token: got %q, want closed %d", got, websocket.StatusPolicyViolation)
	}
}
