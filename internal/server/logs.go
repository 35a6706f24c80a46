package server

import (
	"context"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/agentconn"
)

// Logs streams the output of the sandbox's own command from its agent's
// bounded buffer. A follower is counted against the sandbox's running
// commands (--exec-max-streams), as it may stay as long as the command.
func (s *Server) Logs(ctx context.Context, req *connect.Request[sbxv1.LogsRequest], out *connect.ServerStream[sbxv1.LogsEvent]) error {
	conn, budget, release, err := s.streams.execRelay(ctx, req.Msg.GetSandbox())
	if err != nil {
		return err
	}
	defer release()
	st, err := conn.Logs(ctx, connect.NewRequest(req.Msg))
	if err != nil {
		return err
	}
	defer st.Close()
	for st.Receive() {
		ev := st.Msg()
		if ex := ev.GetExited(); ex != nil {
			s.mgr.MarkEntrypoint(ctx, req.Msg.GetSandbox(), ex)
		}
		if err := budget.spend(ctx, len(ev.GetData().GetData())); err != nil {
			return err
		}
		if err := out.Send(ev); err != nil {
			return err
		}
	}
	if err := st.Err(); err != nil {
		if ctx.Err() != nil {
			return agentconn.ContextError(ctx)
		}
		return err
	}
	return nil
}

// Wait returns once the sandbox's own command has exited. A waiter is
// counted against the sandbox's running commands, like a follower.
func (s *Server) Wait(ctx context.Context, req *connect.Request[sbxv1.WaitRequest]) (*connect.Response[sbxv1.WaitResponse], error) {
	conn, release, err := s.streams.exec(ctx, req.Msg.GetSandbox())
	if err != nil {
		return nil, err
	}
	defer release()
	resp, err := conn.Wait(ctx, connect.NewRequest(req.Msg))
	if err != nil {
		if ctx.Err() != nil {
			return nil, agentconn.ContextError(ctx)
		}
		return nil, err
	}
	s.mgr.MarkEntrypoint(ctx, req.Msg.GetSandbox(), resp.Msg.GetExited())
	return connect.NewResponse(resp.Msg), nil
}
