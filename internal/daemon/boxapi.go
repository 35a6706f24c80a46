package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/sbxdev/sbx/internal/sandbox"
	"github.com/sbxdev/sbx/internal/server"
)

// DefaultBoxAPIPort is the gateway port where sandboxes with a scoped token
// reach the API.
const DefaultBoxAPIPort = 7779

// serveBoxAPI serves the API on the network gateway for sandboxes with a
// scoped token: the firewall opens the port only to those boxes, and the
// front there accepts nothing but a scoped token presented from its own
// box's address (no daemon or tenant token, no open access). It is plain
// HTTP: the traffic never leaves the host's bridge.
func serveBoxAPI(addr string, handler http.Handler, mgr *sandbox.Manager, streams *server.Streams, obs *server.Observer, reqs *server.RequestBudget, cfg Config, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for sandboxes' API on %s: %w", addr, err)
	}
	ln = &perIPLimit{Listener: ln, max: boxAPIConnsPerBox, open: map[string]int{}}
	front := server.NewFront(handler, mgr, server.FrontConfig{
		Tenants: cfg.Tenants, BoxEndpoint: true, Streams: streams, Observer: obs, Requests: reqs, Logger: log.With("component", "box-api"),
	})
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Handler:           front,
		Protocols:         &protos,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	go func() {
		if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
			log.Error("sandboxes' API stopped", "addr", addr, "err", err)
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		front.Close()
	}, nil
}

// boxAPIConnsPerBox bounds the connections one box holds open to the box
// endpoint (a box is hostile: thousands of idle connections would cost the
// daemon a goroutine and an fd each).
const boxAPIConnsPerBox = 64

// perIPLimit closes connections from an address that already holds max.
type perIPLimit struct {
	net.Listener
	max int

	mu sync.Mutex
	// open counts connections by remote IP. Guarded by mu.
	open map[string]int
}

func (l *perIPLimit) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		l.mu.Lock()
		if l.open[ip] >= l.max {
			l.mu.Unlock()
			c.Close()
			continue
		}
		l.open[ip]++
		l.mu.Unlock()
		return &countedConn{Conn: c, release: func() {
			l.mu.Lock()
			if l.open[ip]--; l.open[ip] <= 0 {
				delete(l.open, ip)
			}
			l.mu.Unlock()
		}}, nil
	}
}

type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *countedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
