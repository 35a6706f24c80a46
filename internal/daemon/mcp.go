package daemon

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/sbxdev/sbx/internal/mcp"
)

// mcpEndpoint returns the handler of the daemon's /mcp endpoint: its tools
// call this daemon's API on addr (its own listener; loopback when it listens
// on every address) with each request's token, so they pass the same auth
// and tenancy as any client. Over TLS the client trusts exactly the
// daemon's own certificate.
func mcpEndpoint(addr net.Addr, cfg Config, log *slog.Logger) (http.Handler, error) {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return nil, fmt.Errorf("mcp endpoint: listener address %v is not TCP", addr)
	}
	ip := tcp.IP
	if ip == nil || ip.IsUnspecified() {
		ip = net.IPv4(127, 0, 0, 1)
		if tcp.IP != nil && tcp.IP.To4() == nil {
			ip = net.IPv6loopback
		}
	}
	hostPort := net.JoinHostPort(ip.String(), fmt.Sprint(tcp.Port))
	hc := mcp.HTTPConfig{BaseURL: "http://" + hostPort, Logger: log.With("component", "mcp"),
		TokenRequired: cfg.AuthToken != "" || cfg.Tenants != nil}
	if cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("mcp endpoint: loading the daemon's certificate: %w", err)
		}
		leaf := cert.Certificate[0]
		hc.BaseURL = "https://" + hostPort
		hc.TLS = &tls.Config{
			// The name in the certificate need not be the loopback
			// address: pin the certificate itself instead.
			InsecureSkipVerify: true,
			VerifyConnection: func(cs tls.ConnectionState) error {
				if len(cs.PeerCertificates) == 0 || !bytes.Equal(cs.PeerCertificates[0].Raw, leaf) {
					return errors.New("mcp endpoint: the daemon's listener presented another certificate")
				}
				return nil
			},
		}
	}
	return mcp.Handler(hc), nil
}
