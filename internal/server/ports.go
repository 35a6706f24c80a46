package server

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/sandbox"
)

// PortServer implements sbx.v1.PortService: the addresses of sandbox ports
// on the daemon's proxy, and the ports listening in a sandbox.
type PortServer struct {
	mgr    *sandbox.Manager
	domain string // proxy domain ("" = no host routing)
	public string // the daemon's public URL ("" = from the request)
}

var _ sbxv1connect.PortServiceHandler = (*PortServer)(nil)

func (s *PortServer) GetPort(ctx context.Context, req *connect.Request[sbxv1.GetPortRequest]) (*connect.Response[sbxv1.GetPortResponse], error) {
	port := req.Msg.GetPort()
	if port == 0 || port > 65535 {
		return nil, toConnect(portError(port))
	}
	id, err := s.mgr.ResolveID(ctx, req.Msg.GetSandbox())
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.GetPortResponse{Port: s.info(ctx, id, port)}), nil
}

func (s *PortServer) ListPorts(ctx context.Context, req *connect.Request[sbxv1.ListPortsRequest]) (*connect.Response[sbxv1.ListPortsResponse], error) {
	id, err := s.mgr.ResolveID(ctx, req.Msg.GetSandbox())
	if err != nil {
		return nil, toConnect(err)
	}
	ports, err := s.mgr.ListeningPorts(ctx, id)
	if err != nil {
		return nil, toConnect(err)
	}
	out := &sbxv1.ListPortsResponse{}
	for _, p := range ports {
		pi := s.info(ctx, id, p.Port)
		pi.BindAddress = p.Addr
		out.Ports = append(out.Ports, pi)
	}
	return connect.NewResponse(out), nil
}

func portError(port uint32) error {
	return fmt.Errorf("port %d is not in 1-65535: %w", port, errdefs.ErrInvalidArgument)
}

// info builds the addresses of one port.
func (s *PortServer) info(ctx context.Context, id string, port uint32) *sbxv1.PortInfo {
	base := s.public
	if base == "" {
		base = baseURL(ctx)
	}
	ps := strconv.FormatUint(uint64(port), 10)
	pi := &sbxv1.PortInfo{
		Port:    port,
		Url:     base + "/proxy/" + url.PathEscape(id) + "/" + ps + "/",
		TcpUrl:  base + "/tcp/" + url.PathEscape(id) + "/" + ps,
		Headers: map[string]string{HeaderE2BSandboxID: id, HeaderE2BSandboxPort: ps},
	}
	switch {
	case strings.HasPrefix(pi.Url, "https://"):
		pi.WebsocketUrl = "wss://" + strings.TrimPrefix(pi.Url, "https://")
	case strings.HasPrefix(pi.Url, "http://"):
		pi.WebsocketUrl = "ws://" + strings.TrimPrefix(pi.Url, "http://")
	}
	if s.domain != "" {
		if u, err := url.Parse(base); err == nil && u.Host != "" {
			host := ps + "-" + id + "." + s.domain
			if p := u.Port(); p != "" {
				host += ":" + p
			}
			pi.HostUrl = u.Scheme + "://" + host + "/"
		}
	}
	return pi
}
