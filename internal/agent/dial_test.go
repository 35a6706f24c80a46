package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"connectrpc.com/connect"
)

// tcpTarget starts a TCP server on loopback running handle for each connection.
func tcpTarget(t *testing.T, handle func(*net.TCPConn)) uint32 {
	t.Helper()
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
			go func() {
				defer c.Close()
				handle(c.(*net.TCPConn))
			}()
		}
	}()
	return uint32(ln.Addr().(*net.TCPAddr).Port)
}

func TestDialEchoHalfClose(t *testing.T) {
	a := newTestAgent(t)
	port := tcpTarget(t, func(c *net.TCPConn) {
		_, _ = io.Copy(c, c) // echo until the client half-closes
		_ = c.CloseWrite()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := a.conn.DialTCP(ctx, "", port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	payload := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB, many messages
	go func() {
		_, _ = conn.Write(payload)
		_ = conn.CloseWrite()
	}()
	got, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatalf("echo: got %d bytes, want %d (equal: false)", len(got), len(payload))
	}
}

func TestDialTargetClosesFirst(t *testing.T) {
	a := newTestAgent(t)
	rest := make(chan string, 1)
	port := tcpTarget(t, func(c *net.TCPConn) {
		_, _ = c.Write([]byte("hello"))
		_ = c.CloseWrite()
		b, _ := io.ReadAll(c) // the client still sends after our EOF
		rest <- string(b)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := a.conn.DialTCP(ctx, "127.0.0.1", port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got, err := io.ReadAll(conn)
	if err != nil || string(got) != "hello" {
		t.Fatalf("read: got %q, %v; want \"hello\", nil", got, err)
	}
	if _, err := conn.Write([]byte("late data")); err != nil {
		t.Fatalf("write after the target's EOF: %v", err)
	}
	if err := conn.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-rest:
		if r != "late data" {
			t.Errorf("target got %q, want \"late data\"", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the target never saw the client's EOF")
	}
}

func TestDialCloseTearsDown(t *testing.T) {
	a := newTestAgent(t)
	done := make(chan error, 1)
	port := tcpTarget(t, func(c *net.TCPConn) {
		_, err := io.ReadAll(c)
		done <- err
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := a.conn.DialTCP(ctx, "", port)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the target's connection stayed open after Close")
	}
	if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("read after Close: got %v, want net.ErrClosed", err)
	}
}

func TestDialErrors(t *testing.T) {
	a := newTestAgent(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := uint32(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	for _, tc := range []struct {
		name string
		port uint32
		want connect.Code
	}{
		{"nothing listening", closedPort, connect.CodeUnavailable},
		{"port 0", 0, connect.CodeInvalidArgument},
		{"port too big", 70000, connect.CodeInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := a.conn.DialTCP(ctx, "", tc.port)
			if err == nil {
				c.Close()
				t.Fatal("got a connection, want an error")
			}
			if got := connect.CodeOf(err); got != tc.want {
				t.Errorf("code: got %v, want %v (%v)", got, tc.want, err)
			}
		})
	}
}

func TestDialReadDeadline(t *testing.T) {
	a := newTestAgent(t)
	port := tcpTarget(t, func(c *net.TCPConn) { _, _ = io.ReadAll(c) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := a.conn.DialTCP(ctx, "", port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	var ne net.Error
	if _, err := conn.Read(make([]byte, 1)); !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("read past the deadline: got %v, want a timeout", err)
	}
}
