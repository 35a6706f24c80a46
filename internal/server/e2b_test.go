package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
)

// fakeE2B records what the front hands the E2B API.
type fakeE2B struct {
	calls []string
}

func (f *fakeE2B) IsAPIPath(p string) bool { return p == "/v2/sandboxes" || p == "/sandboxes/sb-x" }
func (f *fakeE2B) Serves(port uint32) bool { return port == 49983 || port == 49999 }
func (f *fakeE2B) ServeAPI(w http.ResponseWriter, r *http.Request, token string) {
	f.calls = append(f.calls, fmt.Sprintf("api %s %s", r.URL.Path, token))
	w.WriteHeader(http.StatusTeapot)
}
func (f *fakeE2B) ServeSandbox(w http.ResponseWriter, r *http.Request, token, sandbox string, port uint32) {
	f.calls = append(f.calls, fmt.Sprintf("sandbox %s %d %s", sandbox, port, token))
	w.WriteHeader(http.StatusTeapot)
}
func (f *fakeE2B) WriteError(w http.ResponseWriter, status int, msg string) {
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": status, "message": msg})
}

// TestFrontRoutesE2B: E2B's control-plane paths and the envd and code
// interpreter ports (by header or host name, not by path) go to the E2B
// API with the token the front accepted; E2B's credentials are X-API-Key
// on the control plane and X-Access-Token / E2B-Traffic-Access-Token on
// the sandbox ports, where Authorization is envd's user name and never a
// credential; a missing or wrong key gets 401 and reaches nothing.
func TestFrontRoutesE2B(t *testing.T) {
	e := newTenancyEnv(t)
	fake := &fakeE2B{}
	f := NewFront(http.NotFoundHandler(), e.mgr, FrontConfig{Tenants: e.registry, ProxyDomain: "sbx.test", E2B: fake, Logger: e.discardLogger})
	defer f.Close()
	type hdr = map[string]string
	for _, tc := range []struct {
		name, method, host, path string
		headers                  hdr
		wantCode                 int
		wantCall                 string // "" = the E2B API is not called
	}{
		{"create with key", "POST", "", "/v2/sandboxes", hdr{"X-API-Key": e.tokA}, http.StatusTeapot, "api /v2/sandboxes " + e.tokA},
		{"get with bearer", "GET", "", "/sandboxes/sb-x", hdr{"Authorization": "Bearer " + e.tokB}, http.StatusTeapot, "api /sandboxes/sb-x " + e.tokB},
		{"no key", "GET", "", "/sandboxes/sb-x", nil, http.StatusUnauthorized, ""},
		{"wrong key", "POST", "", "/v2/sandboxes", hdr{"X-API-Key": "nope"}, http.StatusUnauthorized, ""},
		{"sbx API is not E2B's", "POST", "", "/sbx.v1.SandboxService/ListSandboxes", hdr{"Authorization": "Bearer " + e.tokA}, http.StatusNotFound, ""},
		{"envd by header", "POST", "", "/filesystem.Filesystem/Stat",
			hdr{"E2b-Sandbox-Id": "sb-x", "E2b-Sandbox-Port": "49983", "X-Access-Token": e.tokB, "Authorization": "Basic dXNlcjo="},
			http.StatusTeapot, "sandbox sb-x 49983 " + e.tokB},
		{"interpreter by header", "POST", "", "/contexts",
			hdr{"E2b-Sandbox-Id": "sb-x", "E2b-Sandbox-Port": "49999", "E2B-Traffic-Access-Token": e.tokA},
			http.StatusTeapot, "sandbox sb-x 49999 " + e.tokA},
		{"envd by host name", "GET", "49983-sb-x.sbx.test", "/files?path=/etc/hostname", hdr{"X-Access-Token": e.tokA},
			http.StatusTeapot, "sandbox sb-x 49983 " + e.tokA},
		{"envd: Authorization is not a credential", "POST", "", "/process.Process/List",
			hdr{"E2b-Sandbox-Id": "sb-x", "E2b-Sandbox-Port": "49983", "Authorization": "Bearer " + e.tokA}, http.StatusUnauthorized, ""},
		{"envd: wrong access token", "POST", "", "/process.Process/List",
			hdr{"E2b-Sandbox-Id": "sb-x", "E2b-Sandbox-Port": "49983", "X-Access-Token": "nope"}, http.StatusUnauthorized, ""},
		{"path routing to 49983 is the sandbox's port", "GET", "", "/proxy/sb-x/49983/", hdr{"Authorization": "Bearer " + e.tokA}, http.StatusNotFound, ""},
		{"other ports are the sandbox's", "GET", "", "/",
			hdr{"E2b-Sandbox-Id": "sb-x", "E2b-Sandbox-Port": "8080", "X-Access-Token": e.tokA, "Authorization": "Bearer " + e.tokA}, http.StatusNotFound, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake.calls = nil
			r := httptest.NewRequest(tc.method, tc.path, nil)
			if tc.host != "" {
				r.Host = tc.host
			}
			for k, v := range tc.headers {
				r.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			f.ServeHTTP(w, r)
			if w.Code != tc.wantCode {
				t.Errorf("got status %d (%s), want %d", w.Code, w.Body.String(), tc.wantCode)
			}
			var got string
			if len(fake.calls) > 0 {
				got = fake.calls[0]
			}
			if len(fake.calls) > 1 || got != tc.wantCall {
				t.Errorf("got E2B calls %q, want %q", fake.calls, tc.wantCall)
			}
			if tc.wantCode == http.StatusUnauthorized {
				var body struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
				}
				if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || body.Code != 401 || body.Message == "" {
					t.Errorf("got 401 body %q, want E2B's {code, message}", w.Body.String())
				}
			}
		})
	}
}
