package daemon

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/sbxdev/sbx/internal/e2b"
	"github.com/sbxdev/sbx/internal/mcp"
)

// mcpEndpoint returns the handler of the daemon's /mcp endpoint: its tools
// call this daemon's API on addr (its own listener; loopback when it listens
// on every address) with each request's token, so they pass the same auth
// and tenancy as any client. Over TLS the client trusts exactly the
// daemon's own certificate.
func mcpEndpoint(addr net.Addr, cfg Config, log *slog.Logger) (http.Handler, error) {
	base, tlsConf, err := selfClient(addr, cfg)
	if err != nil {
		return nil, fmt.Errorf("mcp endpoint: %w", err)
	}
	return mcp.Handler(mcp.HTTPConfig{BaseURL: base, TLS: tlsConf, Logger: log.With("component", "mcp"),
		TokenRequired: cfg.AuthToken != "" || cfg.Tenants != nil}), nil
}

// e2bEndpoint returns the E2B-compatible API: like the MCP endpoint, a
// client of this daemon's own API that acts with each request's token.
// envdToken mints sandboxes' envd access tokens (server.EnvdToken).
func e2bEndpoint(addr net.Addr, cfg Config, envdToken func(string) string, log *slog.Logger) (*e2b.Handler, error) {
	base, tlsConf, err := selfClient(addr, cfg)
	if err != nil {
		return nil, fmt.Errorf("e2b api: %w", err)
	}
	return e2b.New(e2b.Config{BaseURL: base, TLS: tlsConf, DefaultImage: cfg.E2BImage, EnvdToken: envdToken,
		Logger: log.With("component", "e2b")}), nil
}

// selfClient returns how the daemon's own handlers reach its API on addr:
// the base URL (loopback when it listens on every address) and, over TLS,
// a client configuration that trusts exactly the daemon's own certificate.
func selfClient(addr net.Addr, cfg Config) (string, *tls.Config, error) {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return "", nil, fmt.Errorf("listener address %v is not TCP", addr)
	}
	ip := tcp.IP
	if ip == nil || ip.IsUnspecified() {
		ip = net.IPv4(127, 0, 0, 1)
		if tcp.IP != nil && tcp.IP.To4() == nil {
			ip = net.IPv6loopback
		}
	}
	hostPort := net.JoinHostPort(ip.String(), fmt.Sprint(tcp.Port))
	if cfg.TLSCert == "" {
		return "http://" + hostPort, nil, nil
	}
	cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
	if err != nil {
		return "", nil, fmt.Errorf("loading the daemon's certificate: %w", err)
	}
	leaf := cert.Certificate[0]
	return "https://" + hostPort, &tls.Config{
		// The name in the certificate need not be the loopback
		// address: pin the certificate itself instead.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 || !bytes.Equal(cs.PeerCertificates[0].Raw, leaf) {
				return errors.New("the daemon's listener presented another certificate")
			}
			return nil
		},
	}, nil
}
