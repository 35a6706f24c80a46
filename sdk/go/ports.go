package sbx

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// Port is how to reach a port of a sandbox through the daemon.
type Port struct {
	Port uint32 `json:"port"`
	// URL routes by path (<daemon>/proxy/<id>/<port>/).
	URL string `json:"url"`
	// HostURL routes by host name; "" unless the daemon has --proxy-domain.
	HostURL string `json:"hostUrl,omitempty"`
	// WebSocketURL is URL with a ws:// or wss:// scheme.
	WebSocketURL string `json:"websocketUrl"`
	// Headers route a request sent to the daemon's own address.
	Headers map[string]string `json:"headers"`
	// TCPURL is the raw TCP endpoint (see DialPort).
	TCPURL string `json:"tcpUrl"`
	// BindAddress is the listening socket's address (Ports only).
	BindAddress string `json:"bindAddress,omitempty"`
}

func portFromProto(p *sbxv1.PortInfo) Port {
	return Port{
		Port: p.GetPort(), URL: p.GetUrl(), HostURL: p.GetHostUrl(), WebSocketURL: p.GetWebsocketUrl(),
		Headers: p.GetHeaders(), TCPURL: p.GetTcpUrl(), BindAddress: p.GetBindAddress(),
	}
}

// Port returns the addresses of a port of the sandbox (whether or not
// anything listens there yet). Requests to them need the daemon's token
// when it has one.
func (s *Sandbox) Port(ctx context.Context, port uint32) (Port, error) {
	resp, err := s.c.ports.GetPort(ctx, connect.NewRequest(&sbxv1.GetPortRequest{Sandbox: s.ID, Port: port}))
	if err != nil {
		return Port{}, wrap(fmt.Sprintf("get port %d of sandbox %s", port, s.ID), err)
	}
	return portFromProto(resp.Msg.GetPort()), nil
}

// PortURL returns the HTTP URL of a port of the sandbox (routed by path).
func (s *Sandbox) PortURL(ctx context.Context, port uint32) (string, error) {
	p, err := s.Port(ctx, port)
	return p.URL, err
}

// Ports lists the TCP ports listening inside the (running) sandbox.
func (s *Sandbox) Ports(ctx context.Context) ([]Port, error) {
	resp, err := s.c.ports.ListPorts(ctx, connect.NewRequest(&sbxv1.ListPortsRequest{Sandbox: s.ID}))
	if err != nil {
		return nil, wrap("list ports of sandbox "+s.ID, err)
	}
	out := make([]Port, 0, len(resp.Msg.GetPorts()))
	for _, p := range resp.Msg.GetPorts() {
		out = append(out, portFromProto(p))
	}
	return out, nil
}

// DialPort opens a raw TCP connection to a port on the sandbox's loopback,
// through the daemon (GET /tcp/<id>/<port> with Upgrade: sbx-tcp). The
// returned net.Conn supports CloseWrite. ctx bounds the connecting only.
func (s *Sandbox) DialPort(ctx context.Context, port uint32) (net.Conn, error) {
	return s.c.DialPort(ctx, s.ID, port)
}

// DialPort is Sandbox.DialPort by sandbox id or name.
func (c *Client) DialPort(ctx context.Context, sandbox string, port uint32) (net.Conn, error) {
	op := fmt.Sprintf("dial port %d of sandbox %s", port, sandbox)
	path := "/tcp/" + url.PathEscape(sandbox) + "/" + strconv.FormatUint(uint64(port), 10)
	conn, br, _, err := c.upgrade(ctx, op, path, "sbx-tcp")
	if err != nil {
		return nil, err
	}
	return &tunnelConn{Conn: conn, r: br}, nil
}

// upgrade opens a connection to the daemon and upgrades it to proto with
// GET path (below the client's base URL) over HTTP/1.1. When the daemon
// answers with anything but 101, status is its HTTP status. The reader
// may hold the first bytes after the answer. ctx bounds the upgrade only.
func (c *Client) upgrade(ctx context.Context, op, path, proto string) (conn net.Conn, br *bufio.Reader, status int, err error) {
	u, err := url.Parse(c.baseURL)
	if err != nil {
		return nil, nil, 0, &Error{Op: op, Code: connect.CodeInvalidArgument, Msg: err.Error()}
	}
	host := u.Host
	if u.Port() == "" {
		if u.Scheme == "https" {
			host = net.JoinHostPort(u.Hostname(), "443")
		} else {
			host = net.JoinHostPort(u.Hostname(), "80")
		}
	}
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, nil, 0, &Error{Op: op, Code: connect.CodeUnavailable, Msg: err.Error()}
	}
	conn = raw
	if u.Scheme == "https" {
		cfg := c.tls.Clone()
		cfg.ServerName, cfg.NextProtos = u.Hostname(), []string{"http/1.1"}
		tc := tls.Client(raw, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, nil, 0, &Error{Op: op, Code: connect.CodeUnavailable, Msg: err.Error()}
		}
		conn = tc
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	fail := func(status int, code connect.Code, msg string) (net.Conn, *bufio.Reader, int, error) {
		stop()
		conn.Close()
		if ctx.Err() != nil {
			return nil, nil, 0, &Error{Op: op, Code: connect.CodeOf(ctx.Err()), Msg: ctx.Err().Error()}
		}
		return nil, nil, status, &Error{Op: op, Code: code, Msg: msg}
	}
	req := "GET " + strings.TrimSuffix(u.Path, "/") + path + " HTTP/1.1\r\nHost: " + u.Host + "\r\nConnection: Upgrade\r\nUpgrade: " + proto + "\r\n"
	if c.token != "" {
		req += "Authorization: Bearer " + c.token + "\r\n"
	}
	if _, err := io.WriteString(conn, req+"\r\n"); err != nil {
		return fail(0, connect.CodeUnavailable, err.Error())
	}
	br = bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return fail(0, connect.CodeUnavailable, "reading the daemon's answer: "+err.Error())
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		return fail(resp.StatusCode, httpCode(resp.StatusCode), strings.TrimSpace(strings.TrimPrefix(string(body), "sbx: ")))
	}
	if !stop() {
		return fail(0, connect.CodeCanceled, "cancelled")
	}
	return conn, br, 0, nil
}

// httpCode maps the proxy's HTTP statuses to codes.
func httpCode(status int) connect.Code {
	switch status {
	case http.StatusBadRequest:
		return connect.CodeInvalidArgument
	case http.StatusUnauthorized:
		return connect.CodeUnauthenticated
	case http.StatusNotFound:
		return connect.CodeNotFound
	case http.StatusConflict:
		return connect.CodeFailedPrecondition
	case http.StatusBadGateway:
		return connect.CodeUnavailable
	}
	return connect.CodeUnknown
}

// tunnelConn is the upgraded connection; reads go through the reader that
// parsed the daemon's answer (it may hold the first bytes).
type tunnelConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *tunnelConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes: the sandbox's side reads EOF.
func (c *tunnelConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return fmt.Errorf("half-close: %T cannot", c.Conn)
}
