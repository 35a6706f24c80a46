package ui

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestHandlerHeaders: every answer carries the strict CSP and no-framing
// headers, the app is served at Prefix, nothing but GET and HEAD is taken,
// and no directory is listed.
func TestHandlerHeaders(t *testing.T) {
	h := Handler()
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/ui/", http.StatusOK},
		{"HEAD", "/ui/", http.StatusOK},
		{"GET", "/ui", http.StatusMovedPermanently},
		{"GET", "/ui/assets/", http.StatusNotFound},
		{"GET", "/ui/nope.js", http.StatusNotFound},
		{"POST", "/ui/", http.StatusMethodNotAllowed},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, nil))
		if rec.Code != tc.want {
			t.Errorf("%s %s: got %d, want %d", tc.method, tc.path, rec.Code, tc.want)
		}
		if got := rec.Header().Get("Content-Security-Policy"); got != CSP {
			t.Errorf("%s %s: got CSP %q, want %q", tc.method, tc.path, got, CSP)
		}
		if got := rec.Header().Get("X-Frame-Options"); got != "DENY" {
			t.Errorf("%s %s: got X-Frame-Options %q, want DENY", tc.method, tc.path, got)
		}
	}
	for _, directive := range strings.Split(CSP, ";") {
		f := strings.Fields(directive)
		if len(f) == 0 || f[0] != "script-src" && f[0] != "connect-src" && f[0] != "default-src" {
			continue
		}
		for _, src := range f[1:] {
			if src != "'self'" && src != "'none'" {
				t.Errorf("CSP %s allows %s, want only 'self'", f[0], src)
			}
		}
	}
}
