package daemon

import (
	"net"
	"testing"
	"time"
)

// TestPerIPLimitBoundsOneAddress: a box holding its share of connections
// gets no more (they are closed at once), and a closed one frees a slot.
func TestPerIPLimitBoundsOneAddress(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &perIPLimit{Listener: inner, max: 3, open: map[string]int{}}
	defer l.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	var clients []net.Conn
	for range 5 {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	var got []net.Conn
	for range 3 {
		select {
		case c := <-accepted:
			got = append(got, c)
		case <-time.After(5 * time.Second):
			t.Fatalf("accepted %d connections, want 3", len(got))
		}
	}
	// The 4th and 5th were closed by the listener: the client reads EOF.
	for _, c := range clients[3:] {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := c.Read(make([]byte, 1)); err == nil || n != 0 {
			t.Errorf("connection past the limit: read %d, %v; want it closed", n, err)
		}
	}
	got[0].Close()
	c, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("after closing one, a new connection was not accepted")
	}
	l.mu.Lock()
	n := l.open["127.0.0.1"]
	l.mu.Unlock()
	if n != 3 {
		t.Errorf("open from 127.0.0.1: got %d, want 3", n)
	}
}
