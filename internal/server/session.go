package server

import (
	"context"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
	"github.com/sbxdev/sbx/internal/codeexec"
	"github.com/sbxdev/sbx/internal/sandbox"
)

// SessionServer implements sbxv1connect.SessionServiceHandler over codeexec.Sessions.
type SessionServer struct {
	svc *codeexec.Sessions
	mgr *sandbox.Manager
}

var _ sbxv1connect.SessionServiceHandler = (*SessionServer)(nil)

// NewSessionServer returns a SessionServer over svc.
func NewSessionServer(svc *codeexec.Sessions, mgr *sandbox.Manager) *SessionServer {
	return &SessionServer{svc: svc, mgr: mgr}
}

// resolveFilter turns a list's sandbox filter (id or name) into the id
// sessions and contexts record; "" stays "" (all the caller may see).
func resolveFilter(ctx context.Context, mgr *sandbox.Manager, ref string) (string, error) {
	if ref == "" {
		return "", nil
	}
	return mgr.ResolveID(ctx, ref)
}

func (s *SessionServer) CreateSession(ctx context.Context, req *connect.Request[sbxv1.CreateSessionRequest]) (*connect.Response[sbxv1.CreateSessionResponse], error) {
	ss, err := s.svc.Create(ctx, req.Msg)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.CreateSessionResponse{Session: ss}), nil
}

func (s *SessionServer) SessionExec(ctx context.Context, req *connect.Request[sbxv1.SessionExecRequest], out *connect.ServerStream[sbxv1.SessionExecEvent]) error {
	return toConnect(s.svc.Exec(ctx, req.Msg, out.Send))
}

func (s *SessionServer) ListSessions(ctx context.Context, req *connect.Request[sbxv1.ListSessionsRequest]) (*connect.Response[sbxv1.ListSessionsResponse], error) {
	sb, err := resolveFilter(ctx, s.mgr, req.Msg.GetSandbox())
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.ListSessionsResponse{Sessions: s.svc.List(ctx, sb)}), nil
}

func (s *SessionServer) CloseSession(ctx context.Context, req *connect.Request[sbxv1.CloseSessionRequest]) (*connect.Response[sbxv1.CloseSessionResponse], error) {
	if err := s.svc.Close(ctx, req.Msg.GetSession()); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.CloseSessionResponse{}), nil
}

// AddSessions serves the session service too.
func (s *Server) AddSessions(sess *SessionServer) { s.sess = sess }
