package server

import (
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sbxdev/sbx/internal/tenant"
)

func TestParseRoute(t *testing.T) {
	for _, tc := range []struct {
		name    string
		host    string
		headers map[string]string
		path    string
		domain  string
		want    route
		wantErr bool
	}{
		{name: "api", host: "127.0.0.1:7777", path: "/sbx.v1.SandboxService/ListSandboxes", want: route{kind: routeAPI}},
		{name: "healthz", path: "/healthz", want: route{kind: routeAPI}},
		{name: "path", path: "/proxy/sb-abc/8080/index.html", want: route{kind: routeHTTP, sandbox: "sb-abc", port: 8080, by: "path", prefix: "/proxy/sb-abc/8080", rest: "/index.html"}},
		{name: "path root", path: "/proxy/dev/80/", want: route{kind: routeHTTP, sandbox: "dev", port: 80, by: "path", prefix: "/proxy/dev/80", rest: "/"}},
		{name: "path no slash", path: "/proxy/dev/80", want: route{kind: routeHTTP, sandbox: "dev", port: 80, by: "path", prefix: "/proxy/dev/80"}},
		{name: "path escaped rest kept", path: "/proxy/dev/80/a%2Fb", want: route{kind: routeHTTP, sandbox: "dev", port: 80, by: "path", prefix: "/proxy/dev/80", rest: "/a%2Fb"}},
		{name: "path port 0", path: "/proxy/dev/0/", wantErr: true},
		{name: "path port too big", path: "/proxy/dev/65536/", wantErr: true},
		{name: "path port not a number", path: "/proxy/dev/http/", wantErr: true},
		{name: "path no port", path: "/proxy/dev", wantErr: true},
		{name: "path no sandbox", path: "/proxy//80/", wantErr: true},
		{name: "tcp", path: "/tcp/sb-1/5432", want: route{kind: routeTCP, sandbox: "sb-1", port: 5432, by: "path"}},
		{name: "tcp extra", path: "/tcp/sb-1/5432/x", wantErr: true},
		{name: "host", host: "8080-sb-3k9x0v2m7abq.sbx.example.com", domain: "sbx.example.com", path: "/x",
			want: route{kind: routeHTTP, sandbox: "sb-3k9x0v2m7abq", port: 8080, by: "host"}},
		{name: "host with port and case", host: "3000-SB-abc.Sbx.Example.com:7777", domain: "sbx.example.com.", path: "/",
			want: route{kind: routeHTTP, sandbox: "sb-abc", port: 3000, by: "host"}},
		{name: "host is the domain itself", host: "sbx.example.com", domain: "sbx.example.com", path: "/healthz", want: route{kind: routeAPI}},
		{name: "host outside the domain", host: "8080-sb-a.other.com", domain: "sbx.example.com", path: "/", want: route{kind: routeAPI}},
		{name: "host without port", host: "sb-a.sbx.example.com", domain: "sbx.example.com", wantErr: true},
		{name: "host nested label", host: "80-a.b.sbx.example.com", domain: "sbx.example.com", wantErr: true},
		{name: "host routing off", host: "8080-sb-a.sbx.example.com", path: "/", want: route{kind: routeAPI}},
		{name: "e2b headers", headers: map[string]string{"E2b-Sandbox-Id": "sb-a", "E2b-Sandbox-Port": "49983"}, path: "/process.Process/Start",
			want: route{kind: routeHTTP, sandbox: "sb-a", port: 49983, by: "header"}},
		{name: "sbx headers", headers: map[string]string{"X-Sbx-Sandbox": "dev", "X-Sbx-Port": "80"}, path: "/",
			want: route{kind: routeHTTP, sandbox: "dev", port: 80, by: "header"}},
		{name: "headers win over host and path", host: "80-sb-x.d.io", domain: "d.io", headers: map[string]string{"X-Sbx-Sandbox": "sb-y", "X-Sbx-Port": "81"},
			path: "/proxy/sb-z/82/", want: route{kind: routeHTTP, sandbox: "sb-y", port: 81, by: "header"}},
		{name: "header id without port", headers: map[string]string{"E2b-Sandbox-Id": "sb-a"}, wantErr: true},
		{name: "header bad port", headers: map[string]string{"X-Sbx-Sandbox": "a", "X-Sbx-Port": "-1"}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tc.headers {
				h.Set(k, v)
			}
			got, err := parseRoute(tc.host, h, tc.path, tc.domain)
			if tc.wantErr {
				if !errors.Is(err, errBadRoute) {
					t.Fatalf("got %+v, %v; want a bad route error", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got, cmp.AllowUnexported(route{})); d != "" {
				t.Errorf("route (-want +got):\n%s", d)
			}
		})
	}
}

const testToken = "0123456789abcdef0123456789abcdef"

func TestStripCredentials(t *testing.T) {
	f := &Front{cfg: FrontConfig{Token: testToken}}
	f.token = f.hash(testToken)
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("user:"+testToken))
	for _, tc := range []struct {
		name        string
		headers     map[string][]string
		url         string
		wantHeaders map[string][]string
		wantQuery   string
	}{
		{
			name: "our bearer, cookie, query and headers",
			headers: map[string][]string{
				"Authorization": {"Bearer " + testToken}, "Cookie": {"a=1; sbx_token=" + testToken + "; b=2", "sbx_token=x"},
				"X-Sbx-Token": {testToken}, "X-Sbx-Sandbox": {"s"}, "X-Sbx-Port": {"1"}, "E2b-Sandbox-Id": {"s"}, "E2b-Sandbox-Port": {"1"},
				"Accept": {"*/*"},
			},
			url:         "/x?sbx_token=" + testToken + "&q=1",
			wantHeaders: map[string][]string{"Cookie": {"a=1; b=2"}, "Accept": {"*/*"}},
			wantQuery:   "q=1",
		},
		{
			name:        "the application's own Authorization stays",
			headers:     map[string][]string{"Authorization": {"Bearer app-token"}, "Cookie": {"sbx_token=" + testToken}},
			url:         "/",
			wantHeaders: map[string][]string{"Authorization": {"Bearer app-token"}},
		},
		{
			name: "Referer keeps everything but the token",
			headers: map[string][]string{"Referer": {
				"http://d/proxy/s/80/page?a=1&sbx_token=" + testToken + "&b=2#frag",
				"http://d/x?sbx%5Ftoken=" + testToken,
				"https://other.example/?q=1",
			}},
			url: "/",
			wantHeaders: map[string][]string{"Referer": {
				"http://d/proxy/s/80/page?a=1&b=2#frag", "http://d/x", "https://other.example/?q=1",
			}},
		},
		{
			name: "the token anywhere else is dropped",
			headers: map[string][]string{
				"Referer":                {"http://d/page?next=%2Fp%3Fsbx_token%3D" + testToken + "&a=1", "not a url %zz " + testToken},
				"Cookie":                 {"a=1; other=" + testToken + "; SBX_TOKEN=" + testToken + "; b=2"},
				"Proxy-Authorization":    {"Bearer " + testToken},
				"Authorization":          {basic},
				"X-Forwarded-Host":       {"evil?sbx_token=" + testToken},
				"X-Custom":               {"keep", "pre-" + testToken + "-post"},
				"Origin":                 {"http://d"},
				"X-" + testToken[:8]:     {"harmless name"},
				"X-Escaped":              {url.QueryEscape("t=" + testToken + "/")},
				"X-Tok-" + testToken[:4]: {"1"},
			},
			url: "/x?next=" + url.QueryEscape("/p?sbx_token="+testToken) + "&q=1&" + testToken + "=1",
			wantHeaders: map[string][]string{
				"Cookie": {"a=1; b=2"}, "X-Custom": {"keep"}, "Origin": {"http://d"},
				"X-" + testToken[:8]: {"harmless name"}, "X-Tok-" + testToken[:4]: {"1"},
			},
			wantQuery: "q=1",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", tc.url, nil)
			r.Header = http.Header(tc.headers).Clone()
			r = admitted(r, tenant.Principal{}, testToken)
			f.stripCredentials(r)
			if d := cmp.Diff(http.Header(tc.wantHeaders), r.Header); d != "" {
				t.Errorf("headers (-want +got):\n%s", d)
			}
			if r.URL.RawQuery != tc.wantQuery {
				t.Errorf("query: got %q, want %q", r.URL.RawQuery, tc.wantQuery)
			}
		})
	}
}

func TestAuth(t *testing.T) {
	f := &Front{}
	f.token = f.hash(testToken)
	for _, tc := range []struct {
		name      string
		api       bool
		method    string
		url       string
		headers   map[string]string
		wantOK    bool
		wantCode  int
		wantSetCk bool
	}{
		{name: "api bearer", api: true, headers: map[string]string{"Authorization": "Bearer " + testToken}, wantOK: true},
		{name: "api lowercase bearer", api: true, headers: map[string]string{"Authorization": "bearer " + testToken}, wantOK: true},
		{name: "api none", api: true, wantCode: 401},
		{name: "api wrong", api: true, headers: map[string]string{"Authorization": "Bearer nope"}, wantCode: 401},
		{name: "api cookie is not enough", api: true, headers: map[string]string{"Cookie": "sbx_token=" + testToken}, wantCode: 401},
		{name: "proxy bearer", headers: map[string]string{"Authorization": "Bearer " + testToken}, wantOK: true},
		{name: "proxy header", headers: map[string]string{"X-Sbx-Token": testToken}, wantOK: true},
		{name: "proxy cookie", headers: map[string]string{"Cookie": "sbx_token=" + testToken}, wantOK: true},
		{name: "proxy query GET redirects with cookie", url: "/proxy/a/80/?x=1&sbx_token=" + testToken, wantCode: 302, wantSetCk: true},
		{name: "proxy query POST passes", method: "POST", url: "/proxy/a/80/?sbx_token=" + testToken, wantOK: true},
		{name: "proxy wrong query", url: "/proxy/a/80/?sbx_token=bad", wantCode: 401},
		{name: "proxy none", wantCode: 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method, u := tc.method, tc.url
			if method == "" {
				method = "GET"
			}
			if u == "" {
				u = "/proxy/a/80/"
			}
			r := httptest.NewRequest(method, u, nil)
			for k, v := range tc.headers {
				r.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			var ok bool
			if tc.api {
				_, ok = f.authAPI(w, r)
			} else {
				_, ok = f.authProxy(w, r, "/")
			}
			if ok != tc.wantOK {
				t.Fatalf("ok: got %v, want %v (status %d)", ok, tc.wantOK, w.Code)
			}
			if !ok && w.Code != tc.wantCode {
				t.Errorf("status: got %d, want %d", w.Code, tc.wantCode)
			}
			if got := w.Header().Get("Set-Cookie") != ""; got != tc.wantSetCk {
				t.Errorf("Set-Cookie: got %q", w.Header().Get("Set-Cookie"))
			}
			if tc.wantCode == 302 {
				if loc := w.Header().Get("Location"); loc != "/proxy/a/80/?x=1" {
					t.Errorf("Location: got %q, want /proxy/a/80/?x=1", loc)
				}
			}
			if !ok && strings.Contains(w.Body.String(), testToken) {
				t.Error("the answer contains the token")
			}
		})
	}
}

func TestCheckListen(t *testing.T) {
	for _, tc := range []struct {
		addr, token string
		insecure    bool
		wantErr     bool
	}{
		{"127.0.0.1:7777", "", false, false},
		{"[::1]:7777", "", false, false},
		{"localhost:7777", "", false, false},
		{"0.0.0.0:7777", "", false, true},
		{":7777", "", false, true},
		{"10.0.0.5:7777", "", false, true},
		{"0.0.0.0:7777", "tok", false, false},
		{"0.0.0.0:7777", "", true, false},
	} {
		if err := CheckListen(tc.addr, tc.token, tc.insecure); (err != nil) != tc.wantErr {
			t.Errorf("CheckListen(%q, token %v, insecure %v): got %v, want error %v", tc.addr, tc.token != "", tc.insecure, err, tc.wantErr)
		}
	}
}

func TestDropTokenCookies(t *testing.T) {
	h := http.Header{"Set-Cookie": {"sbx_token=evil; Path=/", "app=1", " SBX_TOKEN =x"}}
	dropTokenCookies(h)
	if d := cmp.Diff([]string{"app=1"}, h.Values("Set-Cookie")); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}
