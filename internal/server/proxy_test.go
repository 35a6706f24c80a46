package server

import (
	"io"
	"net"
	"testing"
	"time"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

func TestPipeHalfCloseAndLinger(t *testing.T) {
	// client ⇄ [a pipe b] ⇄ server
	client, a := tcpPair(t)
	b, server := tcpPair(t)
	done := make(chan struct{})
	go func() { pipe(a, b, 300*time.Millisecond); close(done) }()

	// Half-close passes on: the server reads EOF and can still answer.
	_, _ = client.Write([]byte("ping"))
	_ = client.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(server)
	if err != nil || string(got) != "ping" {
		t.Fatalf("server read: got %q, %v", got, err)
	}
	_, _ = server.Write([]byte("pong"))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(client, buf); err != nil || string(buf) != "pong" {
		t.Fatalf("client read: got %q, %v", buf, err)
	}
	// The server never closes: the pipe gives up after the linger.
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the pipe stayed open past its linger")
	}
	if _, err := io.ReadAll(client); err != nil {
		t.Errorf("client after the linger: %v, want EOF", err)
	}
}
