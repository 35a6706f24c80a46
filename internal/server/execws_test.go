package server

import (
	"context"
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
	f := NewFront(http.NotFoundHandler(), nil, FrontConfig{Token: "s3cret", UI: ui})
	defer f.Close()
	srv := httptest.NewServer(f)
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
