package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

const portToken = "test-token-0123456789abcdef0123456789"

// portSandbox starts a sandbox running testdata/portserver.py (HTTP on
// 127.0.0.1:8000, TCP echo on 127.0.0.1:9000) and waits for both ports.
func portSandbox(t *testing.T, ctx context.Context, d *daemon) *sbx.Sandbox {
	t.Helper()
	script, err := os.ReadFile("testdata/portserver.py")
	if err != nil {
		t.Fatal(err)
	}
	sb, err := d.client().Create(ctx, sbx.CreateOptions{Command: []string{"/usr/bin/python3", "-c", string(script)}, MemoryBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ports, err := sb.Ports(ctx)
		if err != nil {
			t.Fatalf("list ports: %v", err)
		}
		var got []uint32
		for _, p := range ports {
			got = append(got, p.Port)
		}
		if slices.Contains(got, 8000) && slices.Contains(got, 9000) {
			for _, p := range ports {
				if p.Port == 8000 && p.BindAddress != "127.0.0.1" {
					t.Errorf("port 8000 bound to %q, want 127.0.0.1", p.BindAddress)
				}
			}
			return sb
		}
		if time.Now().After(deadline) {
			t.Fatalf("the test server did not listen in 30s (ports %v)", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type echoed struct {
	Path    string      `json:"path"`
	Headers [][2]string `json:"headers"`
}

func (e echoed) header(k string) string {
	for _, kv := range e.Headers {
		if strings.EqualFold(kv[0], k) {
			return kv[1]
		}
	}
	return ""
}

// do sends a request to the daemon, never following redirects.
func do(t *testing.T, req *http.Request) (*http.Response, string) {
	t.Helper()
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", req.Method, req.URL, err)
	}
	return resp, string(b)
}

func newReq(t *testing.T, method, url string, hdr map[string]string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
		} else {
			req.Header.Set(k, v)
		}
	}
	return req
}

func TestPortProxyAuthAndRouting(t *testing.T) {
	d := startDaemonToken(t, portToken, "--proxy-domain", "sbx.test")
	ctx := ctxT(t, 4*time.Minute)
	sb := portSandbox(t, ctx, d)
	base := "http://" + d.addr
	_, daemonPort, _ := net.SplitHostPort(d.addr)
	auth := map[string]string{"Authorization": "Bearer " + portToken}

	t.Run("api needs the token", func(t *testing.T) {
		_, err := sbx.NewClient(d.addr, sbx.WithToken("")).List(ctx)
		if got := connect.CodeOf(unwrapSDK(err)); got != connect.CodeUnauthenticated {
			t.Errorf("list without a token: got %v (%v), want Unauthenticated", got, err)
		}
		_, err = sbx.NewClient(d.addr, sbx.WithToken("wrong-token-wrong-token")).List(ctx)
		if got := connect.CodeOf(unwrapSDK(err)); got != connect.CodeUnauthenticated {
			t.Errorf("list with a wrong token: got %v (%v), want Unauthenticated", got, err)
		}
		resp, body := do(t, newReq(t, "POST", base+"/sbx.v1.SandboxService/ListSandboxes", map[string]string{"Content-Type": "application/json"}))
		if resp.StatusCode != 401 || !strings.Contains(body, "unauthenticated") {
			t.Errorf("curl-style call without a token: got %d %q, want 401 unauthenticated", resp.StatusCode, body)
		}
	})

	p, err := sb.Port(ctx, 8000)
	if err != nil {
		t.Fatal(err)
	}
	if want := base + "/proxy/" + sb.ID + "/8000/"; p.URL != want {
		t.Errorf("url: got %q, want %q", p.URL, want)
	}
	if want := "http://8000-" + sb.ID + ".sbx.test:" + daemonPort + "/"; p.HostURL != want {
		t.Errorf("host url: got %q, want %q", p.HostURL, want)
	}
	if want := "ws://" + d.addr + "/proxy/" + sb.ID + "/8000/"; p.WebSocketURL != want {
		t.Errorf("websocket url: got %q, want %q", p.WebSocketURL, want)
	}

	for _, tc := range []struct {
		name     string
		url      string
		hdr      map[string]string
		wantCode int
		wantPath string
	}{
		{"path without token", p.URL + "hello", nil, 401, ""},
		{"path with wrong token", p.URL + "hello", map[string]string{"Authorization": "Bearer nope"}, 401, ""},
		{"path", p.URL + "hello?x=1", auth, 200, "/hello?x=1"},
		{"path by name-or-id, no trailing slash redirects", base + "/proxy/" + sb.ID + "/8000", auth, 308, ""},
		{"X-Sbx-Token header", p.URL + "a", map[string]string{"X-Sbx-Token": portToken}, 200, "/a"},
		{"host", base + "/via-host", map[string]string{"Host": "8000-" + sb.ID + ".sbx.test:" + daemonPort, "Authorization": "Bearer " + portToken}, 200, "/via-host"},
		{"host without token", base + "/via-host", map[string]string{"Host": "8000-" + sb.ID + ".sbx.test"}, 401, ""},
		{"e2b headers", base + "/e2b", map[string]string{"E2b-Sandbox-Id": sb.ID, "E2b-Sandbox-Port": "8000", "Authorization": "Bearer " + portToken}, 200, "/e2b"},
		{"sbx headers", base + "/sbx", map[string]string{"X-Sbx-Sandbox": sb.ID, "X-Sbx-Port": "8000", "X-Sbx-Token": portToken}, 200, "/sbx"},
		{"headers without token", base + "/sbx", map[string]string{"X-Sbx-Sandbox": sb.ID, "X-Sbx-Port": "8000"}, 401, ""},
		{"unknown sandbox", base + "/proxy/sb-nosuchbox/8000/", auth, 404, ""},
		{"nothing listening", base + "/proxy/" + sb.ID + "/8999/", auth, 502, ""},
		{"bad port", base + "/proxy/" + sb.ID + "/99999/", auth, 400, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := do(t, newReq(t, "GET", tc.url, tc.hdr))
			if resp.StatusCode != tc.wantCode {
				t.Fatalf("status: got %d (%q), want %d", resp.StatusCode, body, tc.wantCode)
			}
			if strings.Contains(body, portToken) {
				t.Errorf("the token reached the sandbox or the answer: %s", body)
			}
			if tc.wantCode == 502 && !strings.Contains(body, "connection refused") {
				t.Errorf("502 body: got %q, want it to say connection refused", body)
			}
			if tc.wantPath == "" {
				return
			}
			var e echoed
			if err := json.Unmarshal([]byte(body), &e); err != nil {
				t.Fatalf("body %q: %v", body, err)
			}
			if e.Path != tc.wantPath {
				t.Errorf("path seen by the sandbox: got %q, want %q", e.Path, tc.wantPath)
			}
			for _, h := range []string{"X-Sbx-Token", "X-Sbx-Sandbox", "X-Sbx-Port", "E2b-Sandbox-Id", "E2b-Sandbox-Port", "Authorization"} {
				if v := e.header(h); v != "" {
					t.Errorf("the sandbox got header %s: %q", h, v)
				}
			}
			if e.header("X-Forwarded-For") == "" {
				t.Error("no X-Forwarded-For")
			}
		})
	}

	t.Run("browser cookie", func(t *testing.T) {
		resp, _ := do(t, newReq(t, "GET", p.URL+"page?sbx_token="+portToken+"&q=2", nil))
		if resp.StatusCode != 302 {
			t.Fatalf("status: got %d, want 302", resp.StatusCode)
		}
		if loc := resp.Header.Get("Location"); strings.Contains(loc, portToken) || !strings.HasSuffix(loc, "/page?q=2") {
			t.Errorf("redirect: got %q, want .../page?q=2", loc)
		}
		var ck *http.Cookie
		for _, c := range resp.Cookies() {
			if c.Name == "sbx_token" {
				ck = c
			}
		}
		if ck == nil || !ck.HttpOnly {
			t.Fatalf("cookie: got %v, want an HttpOnly sbx_token", resp.Cookies())
		}
		resp, body := do(t, newReq(t, "GET", p.URL+"page?q=2", map[string]string{"Cookie": "app=1; sbx_token=" + ck.Value}))
		if resp.StatusCode != 200 {
			t.Fatalf("with the cookie: got %d %q", resp.StatusCode, body)
		}
		var e echoed
		_ = json.Unmarshal([]byte(body), &e)
		if got := e.header("Cookie"); got != "app=1" {
			t.Errorf("cookie seen by the sandbox: got %q, want \"app=1\"", got)
		}
	})

	// Another sandbox's page (same origin under path routing) can set an
	// sbx_token cookie for this port's path, a longer one, which the
	// browser sends first: the user's own cookie must still count.
	t.Run("a planted cookie before the user's", func(t *testing.T) {
		resp, body := do(t, newReq(t, "GET", p.URL+"page", map[string]string{"Cookie": "sbx_token=planted-by-another-page; app=1; sbx_token=" + portToken}))
		if resp.StatusCode != 200 {
			t.Fatalf("with a planted cookie first: got %d %q, want 200", resp.StatusCode, body)
		}
		var e echoed
		_ = json.Unmarshal([]byte(body), &e)
		if got := e.header("Cookie"); got != "app=1" {
			t.Errorf("cookie seen by the sandbox: got %q, want \"app=1\"", got)
		}
	})

	t.Run("the application's Authorization passes", func(t *testing.T) {
		_, body := do(t, newReq(t, "GET", p.URL+"x", map[string]string{"X-Sbx-Token": portToken, "Authorization": "Basic YXBwOnB3"}))
		var e echoed
		_ = json.Unmarshal([]byte(body), &e)
		if got := e.header("Authorization"); got != "Basic YXBwOnB3" {
			t.Errorf("got %q, want the app's own header", got)
		}
	})

	// A browser sends the URL of the page it came from, which may still
	// carry ?sbx_token= (a POST or an upgrade keeps it): the sandbox must
	// see that Referer without the token, and the token nowhere else either.
	t.Run("token in Referer and other headers", func(t *testing.T) {
		basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("u:"+portToken))
		_, body := do(t, newReq(t, "GET", p.URL+"ref?next="+url.QueryEscape("/x?sbx_token="+portToken)+"&q=1", map[string]string{
			"X-Sbx-Token":      portToken,
			"Referer":          p.URL + "page?a=1&sbx_token=" + portToken,
			"Cookie":           "app=1; copy=" + portToken,
			"Authorization":    basic,
			"X-Forwarded-Host": "h?sbx_token=" + portToken,
			"X-App":            "kept",
		}))
		var e echoed
		if err := json.Unmarshal([]byte(body), &e); err != nil {
			t.Fatalf("body %q: %v", body, err)
		}
		if strings.Contains(body, portToken) {
			t.Errorf("the token reached the sandbox: %s", body)
		}
		if got, want := e.header("Referer"), p.URL+"page?a=1"; got != want {
			t.Errorf("Referer seen by the sandbox: got %q, want %q", got, want)
		}
		if got := e.header("Cookie"); got != "app=1" {
			t.Errorf("Cookie seen by the sandbox: got %q, want \"app=1\"", got)
		}
		if got := e.header("X-App"); got != "kept" || e.Path != "/ref?q=1" {
			t.Errorf("the sandbox got X-App %q and path %q, want \"kept\" and /ref?q=1", got, e.Path)
		}
	})

	t.Run("large body", func(t *testing.T) {
		payload := make([]byte, 24<<20)
		_, _ = rand.Read(payload)
		req, _ := http.NewRequest("POST", p.URL+"upload", bytes.NewReader(payload))
		req.Header.Set("Authorization", "Bearer "+portToken)
		resp, body := do(t, req)
		sum := sha256.Sum256(payload)
		var got struct {
			Len    int    `json:"len"`
			Sha256 string `json:"sha256"`
		}
		_ = json.Unmarshal([]byte(body), &got)
		if resp.StatusCode != 200 || got.Len != len(payload) || got.Sha256 != hex.EncodeToString(sum[:]) {
			t.Errorf("got %d %+v, want 200 len %d sha %x", resp.StatusCode, got, len(payload), sum)
		}
	})

	t.Run("streaming", func(t *testing.T) {
		req := newReq(t, "GET", p.URL+"stream", auth)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		// The server holds the second chunk until /tmp/go exists: the first
		// arrives only if the proxy flushes as it goes.
		line, err := br.ReadString('\n')
		if err != nil || line != "first\n" {
			t.Fatalf("first chunk: got %q, %v", line, err)
		}
		mustRun(t, ctx, sb, "touch /tmp/go")
		rest, err := io.ReadAll(br)
		if err != nil || string(rest) != "second\n" {
			t.Fatalf("rest: got %q, %v", rest, err)
		}
	})

	t.Run("websocket", func(t *testing.T) {
		for _, size := range []int{5, 300, 200 << 10} {
			msg := bytes.Repeat([]byte("w"), size)
			got := wsEcho(t, d.addr, "/proxy/"+sb.ID+"/8000/ws", map[string]string{"Authorization": "Bearer " + portToken}, msg)
			if !bytes.Equal(got, append([]byte("echo:"), msg...)) {
				t.Errorf("size %d: got %d bytes back", size, len(got))
			}
		}
	})

	t.Run("raw tcp through the SDK", func(t *testing.T) {
		conn, err := sb.DialPort(ctx, 9000)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		payload := bytes.Repeat([]byte("abc"), 100000)
		go func() {
			_, _ = conn.Write(payload)
			_ = conn.(interface{ CloseWrite() error }).CloseWrite()
		}()
		got, err := io.ReadAll(conn)
		if err != nil || !bytes.Equal(got, bytes.ToUpper(payload)) {
			t.Errorf("echo: got %d bytes, %v; want %d upper-cased", len(got), err, len(payload))
		}
		if _, err := sbx.NewClient(d.addr, sbx.WithToken("")).DialPort(ctx, sb.ID, 9000); connect.CodeOf(unwrapSDK(err)) != connect.CodeUnauthenticated {
			t.Errorf("dial without a token: got %v, want Unauthenticated", err)
		}
		if _, err := sb.DialPort(ctx, 9001); connect.CodeOf(unwrapSDK(err)) != connect.CodeUnavailable {
			t.Errorf("dial a closed port: got %v, want Unavailable", err)
		}
	})

	t.Run("port-forward", func(t *testing.T) {
		cmd := exec.Command(d.bin, "--addr", d.addr, "port-forward", sb.ID, "0:9000")
		cmd.Env = append(os.Environ(), "SBX_TOKEN="+portToken)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		}()
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil {
			t.Fatalf("port-forward: %v (stderr %q)", err, stderr.String())
		}
		// "Forwarding from 127.0.0.1:NNNN -> sb-...:9000"
		f := strings.Fields(line)
		if len(f) < 3 {
			t.Fatalf("port-forward said %q", line)
		}
		for i := range 3 { // several connections through one forward
			c, err := net.Dial("tcp", f[2])
			if err != nil {
				t.Fatal(err)
			}
			msg := fmt.Sprintf("hello %d", i)
			_, _ = c.Write([]byte(msg))
			_ = c.(*net.TCPConn).CloseWrite()
			got, err := io.ReadAll(c)
			c.Close()
			if err != nil || string(got) != strings.ToUpper(msg) {
				t.Errorf("through port-forward: got %q, %v; want %q", got, err, strings.ToUpper(msg))
			}
		}
	})

	t.Run("cli", func(t *testing.T) {
		out, errs, code := d.cli("", "port", sb.ID, "8000")
		if code != 0 || strings.TrimSpace(out) != p.URL {
			t.Errorf("sbx port: got %q %q exit %d, want %q", out, errs, code, p.URL)
		}
		out, errs, code = d.cli("", "port", sb.ID)
		if code != 0 || !strings.Contains(out, "8000\t127.0.0.1\t"+p.URL) || !strings.Contains(out, "9000\t") {
			t.Errorf("sbx port (list): got %q %q exit %d", out, errs, code)
		}
		out, _, code = d.cli("", "port", "-v", sb.ID, "8000")
		if code != 0 || !strings.Contains(out, "E2b-Sandbox-Id: "+sb.ID) || !strings.Contains(out, p.HostURL) {
			t.Errorf("sbx port -v: got %q exit %d", out, code)
		}
	})

	t.Run("bad port in the API", func(t *testing.T) {
		if _, err := sb.Port(ctx, 0); !sbx.IsInvalidArgument(err) {
			t.Errorf("port 0: got %v, want InvalidArgument", err)
		}
	})

	t.Run("stopped sandbox", func(t *testing.T) {
		if err := sb.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		resp, body := do(t, newReq(t, "GET", p.URL, auth))
		if resp.StatusCode != 409 || !strings.Contains(body, "stopped") {
			t.Errorf("stopped: got %d %q, want 409 saying stopped", resp.StatusCode, body)
		}
		if err := sb.Start(ctx); err != nil {
			t.Fatal(err)
		}
		resp, body = do(t, newReq(t, "GET", p.URL+"again", auth))
		if resp.StatusCode != 200 {
			t.Errorf("after start: got %d %q", resp.StatusCode, body)
		}
	})

	t.Run("destroyed sandbox", func(t *testing.T) {
		// A WebSocket left open must not keep anything alive.
		c, err := net.Dial("tcp", d.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, _ = io.WriteString(c, "GET /proxy/"+sb.ID+"/8000/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: MDEyMzQ1Njc4OWFiY2RlZg==\r\nAuthorization: Bearer "+portToken+"\r\n\r\n")
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 101 {
			t.Fatalf("upgrade: %v %v", resp, err)
		}
		if err := sb.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
		resp, body := do(t, newReq(t, "GET", p.URL, auth))
		if resp.StatusCode != 404 || !strings.Contains(body, "gone") {
			t.Errorf("destroyed: got %d %q, want 404 saying it is gone", resp.StatusCode, body)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Errorf("the open WebSocket did not end with the sandbox: %v", err)
		}
		d.assertNoLeaks()
	})
}

// TestPortProxyNoAuth: on loopback without a token everything works
// without credentials, and a public address without one is refused.
func TestPortProxyNoAuth(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	sb := portSandbox(t, ctx, d)
	url, err := sb.PortURL(ctx, 8000)
	if err != nil {
		t.Fatal(err)
	}
	resp, body := do(t, newReq(t, "GET", url+"open", map[string]string{"Authorization": "Bearer app-secret"}))
	if resp.StatusCode != 200 {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	var e echoed
	_ = json.Unmarshal([]byte(body), &e)
	if e.Path != "/open" || e.header("Authorization") != "Bearer app-secret" {
		t.Errorf("got %+v, want path /open with the app's Authorization", e)
	}

	// An open connection counts as activity: the idle timeout waits for it.
	idle, err := d.client().Create(ctx, sbx.CreateOptions{IdleTimeout: time.Second, MemoryBytes: 64 << 20,
		Command: []string{"/usr/bin/python3", "-c", "import socket,time\ns=socket.socket();s.bind(('127.0.0.1',7000));s.listen();c,_=s.accept();c.recv(1);c.close();time.sleep(3600)"}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(idle.ID)
	var conn net.Conn
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if conn, err = idle.DialPort(ctx, 7000); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dial the idle test's server: %v", err)
		}
	}
	time.Sleep(2500 * time.Millisecond) // > the idle timeout, connection open
	if err := idle.Refresh(ctx); err != nil {
		t.Fatalf("with a connection open the sandbox idled out: %v", err)
	}
	conn.Close() // the server closes on EOF: the proxied connection ends
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if err := idle.Refresh(ctx); sbx.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sandbox did not idle out after its connection closed")
		}
	}

	data := t.TempDir()
	out, err := exec.Command(d.bin, "serve", "--listen", "0.0.0.0:0", "--data-dir", filepath.Join(data, "d"), "--network=false").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "without an API token") {
		t.Errorf("serve on 0.0.0.0 without a token: got %v %q, want a refusal", err, out)
	}
}

// unwrapSDK turns an SDK error back into a connect error for CodeOf.
func unwrapSDK(err error) error {
	if e, ok := err.(*sbx.Error); ok {
		return connect.NewError(e.Code, fmt.Errorf("%s", e.Msg))
	}
	return err
}

// wsEcho sends one masked text frame over a WebSocket to addr+path and
// returns the payload of the answer frame.
func wsEcho(t *testing.T, addr, path string, hdr map[string]string, msg []byte) []byte {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	key := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef"))
	req := "GET " + path + " HTTP/1.1\r\nHost: " + addr + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + key + "\r\n"
	for k, v := range hdr {
		req += k + ": " + v + "\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 101 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("upgrade: got %d %q", resp.StatusCode, b)
	}
	// Client frames are masked.
	mask := [4]byte{1, 2, 3, 4}
	frame := []byte{0x81}
	switch n := len(msg); {
	case n < 126:
		frame = append(frame, 0x80|byte(n))
	case n < 65536:
		frame = append(frame, 0x80|126)
		frame = binary.BigEndian.AppendUint16(frame, uint16(n))
	default:
		frame = append(frame, 0x80|127)
		frame = binary.BigEndian.AppendUint64(frame, uint64(n))
	}
	frame = append(frame, mask[:]...)
	for i, b := range msg {
		frame = append(frame, b^mask[i%4])
	}
	if _, err := c.Write(frame); err != nil {
		t.Fatal(err)
	}
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		t.Fatal(err)
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		_, _ = io.ReadFull(br, b[:])
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		_, _ = io.ReadFull(br, b[:])
		n = binary.BigEndian.Uint64(b[:])
	}
	out := make([]byte, n)
	if _, err := io.ReadFull(br, out); err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte{0x88, 0x80, 0, 0, 0, 0}) // close
	return out
}
