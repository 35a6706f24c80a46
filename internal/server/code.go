package server

import (
	"context"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
	"github.com/sbxdev/sbx/internal/codeexec"
	"github.com/sbxdev/sbx/internal/sandbox"
)

// CodeServer implements sbxv1connect.CodeServiceHandler over a codeexec.Service.
type CodeServer struct {
	svc *codeexec.Service
	mgr *sandbox.Manager
}

var _ sbxv1connect.CodeServiceHandler = (*CodeServer)(nil)

// NewCodeServer returns a CodeServer over svc.
func NewCodeServer(svc *codeexec.Service, mgr *sandbox.Manager) *CodeServer {
	return &CodeServer{svc: svc, mgr: mgr}
}

// AddCode serves the code service too.
func (s *Server) AddCode(code *CodeServer) { s.code = code }

func (c *CodeServer) RunCode(ctx context.Context, req *connect.Request[sbxv1.RunCodeRequest], out *connect.ServerStream[sbxv1.RunCodeEvent]) error {
	return toConnect(c.svc.RunCode(ctx, req.Msg, out.Send))
}

func (c *CodeServer) CreateContext(ctx context.Context, req *connect.Request[sbxv1.CreateContextRequest]) (*connect.Response[sbxv1.CreateContextResponse], error) {
	cc, err := c.svc.CreateContext(ctx, req.Msg)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.CreateContextResponse{Context: cc}), nil
}

func (c *CodeServer) ListContexts(ctx context.Context, req *connect.Request[sbxv1.ListContextsRequest]) (*connect.Response[sbxv1.ListContextsResponse], error) {
	sb, err := resolveFilter(ctx, c.mgr, req.Msg.GetSandbox())
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.ListContextsResponse{Contexts: c.svc.ListContexts(ctx, sb)}), nil
}

func (c *CodeServer) CloseContext(ctx context.Context, req *connect.Request[sbxv1.CloseContextRequest]) (*connect.Response[sbxv1.CloseContextResponse], error) {
	if err := c.svc.CloseContext(ctx, req.Msg.GetContext()); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.CloseContextResponse{}), nil
}
