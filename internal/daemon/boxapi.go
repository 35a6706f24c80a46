package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
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
func serveBoxAPI(addr string, handler http.Handler, mgr *sandbox.Manager, cfg Config, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for sandboxes' API on %s: %w", addr, err)
	}
	front := server.NewFront(handler, mgr, server.FrontConfig{
		Tenants: cfg.Tenants, BoxEndpoint: true, Logger: log.With("component", "box-api"),
	})
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Handler:           front,
		Protocols:         &protos,
		ReadHeaderTimeout: 10 * time.Second,
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
