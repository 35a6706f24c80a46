package ui

import (
	"bytes"
	"compress/gzip"
	"io"
	"io/fs"
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

// TestHandlerGzip: scripts are served gzipped to browsers that take it,
// and the bytes are the embedded file's.
func TestHandlerGzip(t *testing.T) {
	entries, err := fs.ReadDir(dist, "dist/assets")
	if err != nil {
		t.Fatal(err)
	}
	var js string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".js") {
			js = e.Name()
			break
		}
	}
	if js == "" {
		t.Fatal("no script in dist/assets: run make ui")
	}
	want, err := fs.ReadFile(dist, "dist/assets/"+js)
	if err != nil {
		t.Fatal(err)
	}
	h := Handler()
	for _, tc := range []struct {
		accept string
		gzip   bool
	}{{"gzip, deflate, br", true}, {"", false}, {"gzip;q=0", false}} {
		req := httptest.NewRequest("GET", Prefix+"assets/"+js, nil)
		if tc.accept != "" {
			req.Header.Set("Accept-Encoding", tc.accept)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		body := rec.Body.Bytes()
		if got := rec.Header().Get("Content-Encoding") == "gzip"; got != tc.gzip {
			t.Fatalf("Accept-Encoding %q: gzipped = %v, want %v", tc.accept, got, tc.gzip)
		}
		if tc.gzip {
			zr, err := gzip.NewReader(bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			if body, err = io.ReadAll(zr); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(body, want) {
			t.Errorf("Accept-Encoding %q: got %d bytes, want the embedded %d", tc.accept, len(body), len(want))
		}
		if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/javascript") {
			t.Errorf("Accept-Encoding %q: got Content-Type %q, want text/javascript", tc.accept, ct)
		}
	}
}
