package network

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestDNSLimitsPerBox: one source (the attacking box, 127.0.0.1) is held to
// its TCP connections, its idle timeout and its query rate, while another
// (the neighbour, 127.0.0.2) is served as usual.
func TestDNSLimitsPerBox(t *testing.T) {
	upstream := startTestDNS(t, map[string][]netip.Addr{"a.test": {netip.MustParseAddr("198.51.100.10")}})
	client := dnsClient{
		policy: func(src netip.Addr) (Policy, string, bool) { return Policy{Mode: ModePublic}, "n", true },
		allow:  func(string, []netip.Addr, time.Duration) error { return nil },
	}
	lim := Limits{DNSTCPConns: 4, DNSTCPIdleTimeout: time.Second, DNSQueriesPerSec: 10}
	start := func() *dnsForwarder {
		f, err := startDNS("127.0.0.1:0", []string{upstream}, client, lim, slog.Default())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(f.close)
		return f
	}
	f := start()
	attacker, neighbour := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	dial := func(proto string, from netip.Addr) net.Conn {
		t.Helper()
		d := net.Dialer{Timeout: time.Second}
		if proto == "tcp" {
			d.LocalAddr = &net.TCPAddr{IP: from.AsSlice()}
		} else {
			d.LocalAddr = &net.UDPAddr{IP: from.AsSlice()}
		}
		c, err := d.Dial(proto, f.addr())
		if err != nil {
			if proto == "tcp" && from == attacker {
				return nil // reset by the forwarder before the dial returned
			}
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// tcpAsk sends a query on c and reports whether an answer came.
	tcpAsk := func(c net.Conn) bool {
		if c == nil {
			return false
		}
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if writeTCPMsg(c, mustQuery(t, 7, "a.test")) != nil {
			return false
		}
		r, err := readTCPMsg(c)
		return err == nil && len(r) > 3 && r[3]&0x0F == 0
	}

	// TCP: of 40 connections, the first 4 are kept; the rest are reset.
	var conns []net.Conn
	for range 40 {
		conns = append(conns, dial("tcp", attacker))
	}
	answered := 0
	for _, c := range conns {
		if tcpAsk(c) {
			answered++
		}
	}
	if answered != lim.DNSTCPConns {
		t.Errorf("attacker's TCP connections answered: got %d, want %d (its limit)", answered, lim.DNSTCPConns)
	}
	if got := f.tcpConns.Held(attacker); got > lim.DNSTCPConns {
		t.Errorf("attacker holds %d TCP connections, want at most %d", got, lim.DNSTCPConns)
	}
	if !tcpAsk(dial("tcp", neighbour)) {
		t.Error("neighbour's TCP query not answered while the attacker is at its limit")
	}
	// Idle: the kept connections are closed by the forwarder.
	for i, c := range conns[:lim.DNSTCPConns] {
		if c == nil {
			t.Fatalf("attacker's connection %d (within its limit) was refused", i)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Errorf("idle connection %d: read got %v, want EOF (closed by the forwarder after its idle timeout)", i, err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for f.tcpConns.Held(attacker) != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := f.tcpConns.Held(attacker); got != 0 {
		t.Fatalf("attacker still holds %d TCP connections after they were closed", got)
	}
	if !tcpAsk(dial("tcp", attacker)) {
		t.Error("attacker's TCP query not answered after its connections were closed (no recovery)")
	}

	// UDP: 200 queries at once get about the burst (twice the rate)
	// answered; the neighbour's are all answered.
	f = start() // full buckets
	ua, un := dial("udp", attacker), dial("udp", neighbour)
	q := mustQuery(t, 9, "a.test")
	for range 200 {
		_, _ = ua.Write(q)
	}
	got := 0
	buf := make([]byte, 512)
	for {
		_ = ua.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := ua.Read(buf); err != nil {
			break
		}
		got++
	}
	if got < 20 || got > 30 {
		t.Errorf("attacker's UDP flood of 200: got %d answered, want the burst of 20 (and the few a second refills)", got)
	}
	for i := range 5 {
		_, _ = un.Write(q)
		_ = un.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := un.Read(buf); err != nil {
			t.Errorf("neighbour's UDP query %d during the flood: %v", i, err)
		}
	}
}
