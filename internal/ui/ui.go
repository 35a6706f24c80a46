// Package ui serves the web dashboard: the single-page app in web/, built by
// Vite into dist/ (committed, so `go build` needs no npm; scripts/check-ui.sh
// checks that it matches web/'s sources) and embedded in the daemon. The
// files are static and hold no secrets: the page asks for the API token and
// keeps it in the tab's sessionStorage, and everything it shows comes from
// the API (Authorization: Bearer) and the terminal WebSocket
// (internal/server execws.go), which authenticate as usual. What the page
// shows was written by sandbox code (names, labels, file names, logs), so it
// renders text only, and every response carries a Content-Security-Policy
// that allows no inline or foreign script, no framing, and connections only
// to the daemon itself. The daemon serves it on a listener of its own
// (server.Front.Dashboard), an origin no sandbox content is served on.
// Imported by internal/daemon only.
package ui

import (
	"bytes"
	"compress/gzip"
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed all:dist
var dist embed.FS

// Prefix is where the dashboard is served.
const Prefix = "/ui/"

// CSP is every dashboard response's Content-Security-Policy: scripts only
// from the daemon's own files (no inline script, no eval), fetches and
// WebSockets only to the daemon, no plugins, no <base>, no form posts, and
// no framing by anyone (not by a page a sandbox serves through the port
// proxy either). Styles may be inline because
// xterm.js's renderer writes <style> elements; the page never turns a string
// into markup, so no one else's styles get in.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; font-src 'self'; " +
	"connect-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the embedded dashboard under Prefix (GET and HEAD only).
func Handler() http.Handler {
	sub, err := fs.Sub(dist, "dist")
	if err != nil {
		panic("ui: embedded dist: " + err.Error())
	}
	files := http.FileServerFS(sub)
	zipped := gzipAssets(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Add("Vary", "Accept-Encoding")
		h.Set("Content-Security-Policy", CSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "sbx: the dashboard's files take GET and HEAD only", http.StatusMethodNotAllowed)
			return
		}
		if r.URL.Path == strings.TrimSuffix(Prefix, "/") {
			http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
			return
		}
		name, ok := strings.CutPrefix(path.Clean(r.URL.Path), strings.TrimSuffix(Prefix, "/"))
		if !ok {
			http.NotFound(w, r)
			return
		}
		name = strings.TrimPrefix(name, "/")
		if name == "" || name == "index.html" {
			// The app routes by the URL's fragment: one document.
			h.Set("Cache-Control", "no-cache")
			serveFile(w, r, sub, "index.html")
			return
		}
		if strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r) // no directory listings
			return
		}
		if strings.HasPrefix(name, "assets/") {
			// Vite puts a content hash in every asset's name.
			h.Set("Cache-Control", "public, max-age=31536000, immutable")
			if z, ok := zipped[name]; ok && acceptsGzip(r) {
				h.Set("Content-Encoding", "gzip")
				h.Set("Content-Type", z.contentType)
				http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(z.data))
				return
			}
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/" + name
		files.ServeHTTP(w, r2)
	})
}

type gzipped struct {
	data        []byte
	contentType string
}

// gzipAssets compresses the scripts and styles under assets/ once (about
// a quarter of their size), for browsers that take gzip.
func gzipAssets(fsys fs.FS) map[string]gzipped {
	out := map[string]gzipped{}
	entries, _ := fs.ReadDir(fsys, "assets")
	for _, e := range entries {
		name := "assets/" + e.Name()
		var ct string
		switch path.Ext(name) {
		case ".js":
			ct = "text/javascript; charset=utf-8"
		case ".css":
			ct = "text/css; charset=utf-8"
		default:
			continue
		}
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			continue
		}
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		_, _ = zw.Write(b)
		_ = zw.Close()
		out[name] = gzipped{buf.Bytes(), ct}
	}
	return out
}

// acceptsGzip reports whether r's Accept-Encoding takes gzip.
func acceptsGzip(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept-Encoding") {
		for _, part := range strings.Split(v, ",") {
			enc, params, _ := strings.Cut(strings.TrimSpace(part), ";")
			if strings.EqualFold(strings.TrimSpace(enc), "gzip") && !strings.Contains(strings.ReplaceAll(params, " ", ""), "q=0") {
				return true
			}
		}
	}
	return false
}

func serveFile(w http.ResponseWriter, r *http.Request, fsys fs.FS, name string) {
	b, err := fs.ReadFile(fsys, name)
	if err != nil {
		http.Error(w, "sbx: the dashboard is not built into this binary (make ui)", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(b)
}
