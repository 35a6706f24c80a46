package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// TCPUpgrade is the Upgrade token of the raw TCP endpoint /tcp/SANDBOX/PORT.
const TCPUpgrade = "sbx-tcp"

type routeKey struct{}

// proxyTarget is a resolved route, carried in the request's context.
type proxyTarget struct {
	route
	id string
}

func (f *Front) initProxy() {
	f.tr = &http.Transport{
		// Connections go through the sandbox's agent: the "address" is
		// <sandbox-id>:<port> (never resolved).
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			id, portStr, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			port, err := strconv.ParseUint(portStr, 10, 16)
			if err != nil {
				return nil, fmt.Errorf("port %q: %w", portStr, errdefs.ErrInvalidArgument)
			}
			return f.mgr.DialPort(ctx, id, uint32(port))
		},
		// An idle pooled connection holds its sandbox active: keep few, briefly.
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       5 * time.Second,
		ResponseHeaderTimeout: 0, // long polls and slow apps are fine
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}
	f.proxy = &httputil.ReverseProxy{
		Rewrite:       f.rewrite,
		Transport:     f.tr,
		FlushInterval: -1, // stream every write (SSE, chunked progress)
		ErrorHandler:  f.proxyError,
		// A sandbox must not replace (or clear) the browser's token cookie:
		// under path routing it shares the daemon's origin.
		ModifyResponse: func(resp *http.Response) error {
			dropTokenCookies(resp.Header)
			if t, ok := resp.Request.Context().Value(routeKey{}).(*proxyTarget); ok && t.by == "path" {
				dropOriginWideHeaders(resp.Header)
			}
			return nil
		},
	}
}

// originWideHeaders are response headers that act on a whole origin, not
// on the path that sent them. Under path routing a sandbox's pages share the
// daemon's origin (the API, the dashboard at /ui/), so a sandbox may not send
// them: Service-Worker-Allowed would let a service worker it registers take
// scope "/" and serve its own /ui/ to capture the token typed into the login
// page; Clear-Site-Data would wipe the dashboard's session.
var originWideHeaders = []string{"Service-Worker-Allowed", "Clear-Site-Data"}

// dropOriginWideHeaders removes originWideHeaders from a path-routed
// sandbox's response.
func dropOriginWideHeaders(h http.Header) {
	for _, k := range originWideHeaders {
		h.Del(k)
	}
}

// dropTokenCookies removes Set-Cookie headers naming the daemon's cookie.
func dropTokenCookies(h http.Header) {
	vals := h.Values("Set-Cookie")
	if len(vals) == 0 {
		return
	}
	h.Del("Set-Cookie")
	for _, v := range vals {
		name, _, _ := strings.Cut(v, "=")
		if !strings.EqualFold(strings.TrimSpace(name), TokenCookie) {
			h.Add("Set-Cookie", v)
		}
	}
}

func (f *Front) rewrite(pr *httputil.ProxyRequest) {
	t := pr.In.Context().Value(routeKey{}).(*proxyTarget)
	out := pr.Out
	out.URL.Scheme = "http"
	out.URL.Host = net.JoinHostPort(t.id, strconv.FormatUint(uint64(t.port), 10))
	if t.by == "path" {
		p, err := url.PathUnescape(t.rest)
		if err != nil { // checked in serveProxy
			p = "/"
		}
		out.URL.Path, out.URL.RawPath = p, t.rest
		if out.URL.RawPath == p {
			out.URL.RawPath = ""
		}
	}
	// The application sees the Host the client used (dev servers check it).
	out.Host = pr.In.Host
	pr.SetXForwarded()
	if t.prefix != "" {
		out.Header.Set("X-Forwarded-Prefix", t.prefix)
	}
	f.stripCredentials(out)
}

// serveProxy forwards an HTTP (or WebSocket) request to a sandbox port.
func (f *Front) serveProxy(w http.ResponseWriter, r *http.Request, rt route) {
	if rt.by == "path" && rt.rest == "" {
		// /proxy/ID/PORT → /proxy/ID/PORT/ so relative links resolve.
		u := *r.URL
		u.Path, u.RawPath = u.Path+"/", ""
		u.Scheme, u.Host = "", ""
		http.Redirect(w, r, u.RequestURI(), http.StatusPermanentRedirect)
		return
	}
	if _, err := url.PathUnescape(rt.rest); err != nil {
		http.Error(w, "sbx: bad path: "+err.Error(), http.StatusBadRequest)
		return
	}
	id, release, ok := f.admit(r.Context(), w, rt.sandbox)
	if !ok {
		return
	}
	defer release()
	t := &proxyTarget{route: rt, id: id}
	f.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), routeKey{}, t)))
}

// admit finds the running sandbox ref names and counts a connection against
// its limit (see acquire); false once it has answered w with why not.
func (f *Front) admit(ctx context.Context, w http.ResponseWriter, ref string) (id string, release func(), ok bool) {
	id, err := f.mgr.RunningID(ctx, ref)
	if err != nil {
		f.writeError(w, err)
		return "", nil, false
	}
	release, ok = f.acquire(w, id)
	return id, release, ok
}

// acquire counts a proxied connection against sandbox id's limit, or
// answers 503 (with Retry-After) if the sandbox has as many open as
// allowed: the client of one busy sandbox waits, other sandboxes and the
// API do not notice.
func (f *Front) acquire(w http.ResponseWriter, id string) (release func(), ok bool) {
	release, ok = f.conns.Acquire(id)
	if !ok {
		if o := f.cfg.Observer; o != nil && o.Metrics != nil {
			o.Metrics.Dropped(id)
		}
		w.Header().Set("Retry-After", "1")
		w.Header().Set("Connection", "close")
		http.Error(w, fmt.Sprintf("sbx: sandbox %s has %d connections open through the port proxy, the most allowed (sbx serve --proxy-max-conns): try again later", id, f.conns.Max()), http.StatusServiceUnavailable)
	}
	return release, ok
}

func (f *Front) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // the client left
	}
	f.writeError(w, err)
}

// writeError answers a proxied request that could not reach its sandbox.
func (f *Front) writeError(w http.ResponseWriter, err error) {
	code := http.StatusBadGateway
	switch {
	case errdefs.IsNotFound(err):
		code = http.StatusNotFound
	case errdefs.IsFailedPrecondition(err):
		code = http.StatusConflict
	case errdefs.IsInvalidArgument(err):
		code = http.StatusBadRequest
	case errors.Is(err, errdefs.ErrUnavailable):
		code = http.StatusBadGateway
	default:
		f.log.Debug("proxy error", "err", err)
	}
	http.Error(w, "sbx: "+err.Error(), code)
}

// serveTCP turns GET /tcp/SANDBOX/PORT with "Upgrade: sbx-tcp" into a byte
// pipe to the port (HTTP/1.1 only: HTTP/2 cannot hand over its connection).
func (f *Front) serveTCP(w http.ResponseWriter, r *http.Request, rt route) {
	if r.Method != http.MethodGet || !isUpgrade(r) || !headerHasToken(r.Header, "Upgrade", TCPUpgrade) {
		http.Error(w, "sbx: /tcp/SANDBOX/PORT needs GET with Connection: Upgrade and Upgrade: "+TCPUpgrade+" over HTTP/1.1", http.StatusBadRequest)
		return
	}
	if r.ProtoMajor != 1 {
		http.Error(w, "sbx: raw TCP needs HTTP/1.1", http.StatusHTTPVersionNotSupported)
		return
	}
	id, release, ok := f.admit(r.Context(), w, rt.sandbox)
	if !ok {
		return
	}
	defer release()
	conn, err := f.mgr.DialPort(r.Context(), id, rt.port)
	if err != nil {
		f.writeError(w, err)
		return
	}
	defer conn.Close()
	client, br, ok := upgradeConn(w, TCPUpgrade)
	if !ok {
		return
	}
	defer client.Close()
	pipe(bufConn{Conn: client, r: br}, conn, halfCloseLinger)
}

// upgradeConn takes over the connection of w's (checked) upgrade request
// and answers 101 for proto. The reader may hold bytes the client sent
// after its request. ok is false if that failed (the client was told, if
// it could be).
func upgradeConn(w http.ResponseWriter, proto string) (nc net.Conn, br *bufio.Reader, ok bool) {
	nc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, "sbx: cannot take over the connection: "+err.Error(), http.StatusInternalServerError)
		return nil, nil, false
	}
	_ = nc.SetDeadline(time.Time{})
	_, err = io.WriteString(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+proto+"\r\n\r\n")
	if err == nil {
		err = brw.Flush()
	}
	if err != nil {
		nc.Close()
		return nil, nil, false
	}
	return nc, brw.Reader, true
}

// bufConn reads through a bufio.Reader that may hold bytes already read.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c bufConn) CloseWrite() error { return closeWrite(c.Conn) }

func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

// halfCloseLinger is how long a raw TCP pipe stays open after one side has
// finished sending while the other has not: a client that closed fully
// looks the same as one that half-closed, and a sandbox server that never
// answers would otherwise hold the connection (and keep the sandbox
// active) until the sandbox dies.
const halfCloseLinger = time.Minute

// pipe copies both ways, passing half-closes on, until both directions end,
// one fails (which closes both) or linger passes after the first one ended.
func pipe(a, b net.Conn, linger time.Duration) {
	var wg sync.WaitGroup
	var once sync.Once
	closeBoth := func() { once.Do(func() { a.Close(); b.Close() }) }
	var lingerOnce sync.Once
	cp := func(dst, src net.Conn) {
		defer wg.Done()
		if _, err := io.Copy(dst, src); err != nil {
			closeBoth()
			return
		}
		if err := closeWrite(dst); err != nil {
			closeBoth()
			return
		}
		lingerOnce.Do(func() { time.AfterFunc(linger, closeBoth) })
	}
	wg.Add(2)
	go cp(a, b)
	go cp(b, a)
	wg.Wait()
	closeBoth()
}
