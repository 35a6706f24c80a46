package network

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// splicePair runs both directions of an idle-watched splice between a box
// side and an upstream side, and returns the ends the test plays and the
// copies' results.
func splicePair(t *testing.T, idle time.Duration) (box, server net.Conn, errs chan error) {
	t.Helper()
	box, proxyBox := net.Pipe()
	proxyUp, server := net.Pipe()
	t.Cleanup(func() { box.Close(); server.Close(); proxyBox.Close(); proxyUp.Close() })
	w := newIdleWatch(idle)
	errs = make(chan error, 2)
	go func() { errs <- w.copy(proxyUp, proxyBox, proxyBox) }()
	go func() { errs <- w.copy(proxyBox, proxyUp, proxyUp) }()
	return box, server, errs
}

func TestEgressIdleTimeout(t *testing.T) {
	const idle = 200 * time.Millisecond
	t.Run("idle both ways ends", func(t *testing.T) {
		_, _, errs := splicePair(t, idle)
		select {
		case err := <-errs:
			if !errors.Is(err, errIdle) {
				t.Errorf("got %v, want errIdle", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("an idle connection was kept past 25 idle timeouts")
		}
	})
	t.Run("one busy direction keeps the quiet one", func(t *testing.T) {
		box, server, errs := splicePair(t, idle)
		go func() { _, _ = io.Copy(io.Discard, box) }()
		start := time.Now()
		for time.Since(start) < 4*idle {
			if _, err := server.Write([]byte("data")); err != nil {
				t.Fatalf("a download was cut while data flowed: %v", err)
			}
			time.Sleep(idle / 4)
		}
		select {
		case err := <-errs:
			t.Fatalf("a direction ended (%v) while the other was busy", err)
		default:
		}
		// Traffic stops: both end within a few timeouts.
		for range 2 {
			select {
			case <-errs:
			case <-time.After(5 * time.Second):
				t.Fatal("the connection was kept after traffic stopped")
			}
		}
	})
}
