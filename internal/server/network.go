package server

import (
	"context"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

func (s *Server) UpdateNetwork(ctx context.Context, req *connect.Request[sbxv1.UpdateNetworkRequest]) (*connect.Response[sbxv1.UpdateNetworkResponse], error) {
	sb, err := s.mgr.UpdateNetwork(ctx, req.Msg.GetSandbox(), req.Msg.GetNetwork())
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.UpdateNetworkResponse{Sandbox: sb}), nil
}
