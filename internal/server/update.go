package server

import (
	"context"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

func (s *Server) UpdateSandbox(ctx context.Context, req *connect.Request[sbxv1.UpdateSandboxRequest]) (*connect.Response[sbxv1.UpdateSandboxResponse], error) {
	sb, err := s.mgr.Update(ctx, req.Msg)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.UpdateSandboxResponse{Sandbox: sb}), nil
}
