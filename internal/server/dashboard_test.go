package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestDashboardOwnOrigin: the dashboard's listener serves nothing a sandbox
// controls (no path, header or host-name route to a sandbox port), its
// terminal refuses a page of the API listener's origin (where sandboxes'
// pages are proxied), the API listener serves no dashboard (it redirects to
// the dashboard's port), and the cookie a browser gets for a path-routed
// port covers only that port's prefix.
func TestDashboardOwnOrigin(t *testing.T) {
	ui := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("dashboard")) })
	f := NewFront(http.NotFoundHandler(), nil, FrontConfig{Token: "s3cret", ProxyDomain: "sbx.test", DashboardPort: 7778})
	defer f.Close()
	api := httptest.NewServer(f)
	defer api.Close()
	dash := httptest.NewServer(f.Dashboard(ui))
	defer dash.Close()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(base, path string, h http.Header, host string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range h {
			req.Header[k] = v
		}
		if host != "" {
			req.Host = host
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	auth := http.Header{"Authorization": {"Bearer s3cret"}}
	for _, tc := range []struct {
		name string
		path string
		h    http.Header
		host string
	}{
		{"path route", "/proxy/box/8000/", auth, ""},
		{"path route with the query token", "/proxy/box/8000/?sbx_token=s3cret", nil, ""},
		{"tcp route", "/tcp/box/8000", auth, ""},
		{"sbx headers", "/", http.Header{"Authorization": {"Bearer s3cret"}, HeaderSandbox: {"box"}, HeaderPort: {"8000"}}, ""},
		{"e2b headers", "/", http.Header{"X-Access-Token": {"s3cret"}, HeaderE2BSandboxID: {"box"}, HeaderE2BSandboxPort: {"49983"}}, ""},
		{"host name", "/", auth, "8000-box.sbx.test"},
		{"exec upgrade", ExecPath, auth, ""},
	} {
		if got := get(dash.URL, tc.path, tc.h, tc.host).StatusCode; got != http.StatusNotFound {
			t.Errorf("dashboard listener, %s: got %d, want 404", tc.name, got)
		}
	}
	for _, p := range []string{"/", "/ui/", "/ui/index.html"} {
		resp := get(api.URL, p, nil, "")
		if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusFound || loc != "http://127.0.0.1:7778/ui/" {
			t.Errorf("API listener GET %s: got %d Location %q, want 302 to http://127.0.0.1:7778/ui/", p, resp.StatusCode, loc)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name, url, origin string
		ok                bool
	}{
		{"dashboard page", dash.URL, dash.URL, true},
		{"a sandbox's page on the API listener", dash.URL, api.URL, false},
		{"an opaque origin", dash.URL, "null", false},
		{"the API listener's own terminal path", api.URL, api.URL, false},
	} {
		u := "ws" + strings.TrimPrefix(tc.url, "http") + ExecWSPath
		c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {tc.origin}}})
		if c != nil {
			c.CloseNow() //nolint:errcheck
		}
		if got := err == nil; got != tc.ok {
			t.Errorf("terminal WebSocket, %s (Origin %s): got connected=%v (%v), want %v", tc.name, tc.origin, got, err, tc.ok)
		}
	}

	resp := get(api.URL, "/proxy/box/8000/app?sbx_token=s3cret", nil, "")
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == TokenCookie {
			cookie = c
		}
	}
	if cookie == nil || cookie.Path != "/proxy/box/8000/" || !cookie.HttpOnly {
		t.Errorf("path-routed port's cookie: got %+v, want HttpOnly with Path /proxy/box/8000/", cookie)
	}
	resp = get(api.URL, "/?sbx_token=s3cret", nil, "8000-box.sbx.test")
	if c := resp.Cookies(); len(c) != 1 || c[0].Path != "/" {
		t.Errorf("host-routed port's cookie: got %+v, want one with Path /", c)
	}
	if loc, _ := url.Parse(resp.Header.Get("Location")); loc == nil || loc.Query().Has(TokenQueryParam) {
		t.Errorf("host-routed redirect: got Location %q, want it without the token", resp.Header.Get("Location"))
	}
}
