package server

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sbxdev/sbx/internal/metrics"
)

// TestPortProxyConnsPerSandbox: a sandbox's port holding every connection
// open gets at most MaxConnsPerSandbox through the proxy, raw TCP and HTTP
// together; the excess is answered 503, the API still answers, and a
// connection closing makes room again.
func TestPortProxyConnsPerSandbox(t *testing.T) {
	e := newExecEnv(t, nil)
	const max = 5
	m := metrics.New(metrics.Config{})
	e.front.Store(NewFront(New(e.mgr).Handler(), e.mgr, FrontConfig{Token: execTestToken, MaxConnsPerSandbox: max,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Observer: &Observer{Mgr: e.mgr, Metrics: m}}))
	// The fake driver's agent dials the host's loopback: a server there
	// that reads and never answers (the box code holding connections).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	host := strings.TrimPrefix(e.srv.URL, "http://")
	// open sends a request on a new connection and returns it and the
	// response's status.
	open := func(req string) (net.Conn, int) {
		t.Helper()
		c, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("reading the proxy's answer: %v", err)
		}
		_ = c.SetDeadline(time.Time{})
		return c, resp.StatusCode
	}
	tcpReq := fmt.Sprintf("GET /tcp/%s/%d HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", e.sb, port, execTestToken, TCPUpgrade)
	httpReq := fmt.Sprintf("GET /proxy/%s/%d/ HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", e.sb, port, execTestToken)
	var held []net.Conn
	for i := range max - 1 {
		c, code := open(tcpReq)
		if code != http.StatusSwitchingProtocols {
			t.Fatalf("raw TCP connection %d (within the limit): got %d, want 101", i, code)
		}
		held = append(held, c)
	}
	// An HTTP request the sandbox never answers takes the last place.
	hc, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hc.Close() })
	_, _ = io.WriteString(hc, httpReq)
	deadline := time.Now().Add(10 * time.Second)
	for e.front.Load().conns.Held(e.sb) < max && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	for i := range 10 {
		for _, req := range []string{tcpReq, httpReq} {
			if _, code := open(req); code != http.StatusServiceUnavailable {
				t.Errorf("connection %d past the limit: got %d, want 503", max+i, code)
			}
		}
	}
	// Each refusal counts as a dropped connection of the sandbox.
	if _, dropped := m.Counts(e.sb); dropped != 20 {
		t.Errorf("dropped connections of %s: %d, want 20", e.sb, dropped)
	}
	c, _ := e.client(t)
	if _, err := c.List(t.Context()); err != nil {
		t.Errorf("the API while the sandbox is at its limit: %v", err)
	}
	// One closes: room for one more.
	held[0].Close()
	for e.front.Load().conns.Held(e.sb) >= max && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if _, code := open(tcpReq); code != http.StatusSwitchingProtocols {
		t.Errorf("after a connection closed: got %d, want 101", code)
	}
}
