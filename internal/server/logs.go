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
			s.markEntrypointOOM(ctx, req.Msg.GetSandbox(), ex)
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
	s.markEntrypointOOM(ctx, req.Msg.GetSandbox(), resp.Msg.GetExited())
	return connect.NewResponse(resp.Msg), nil
}

// markEntrypointOOM sets oom_killed on the exit of a sandbox's command
// killed by SIGKILL (or a shell reporting 137) if the sandbox's memory
// limit killed a process since the daemon last looked (as for Exec).
func (s *Server) markEntrypointOOM(ctx context.Context, sandbox string, ex *sbxv1.ExecExited) {
	if ex != nil && (ex.GetSignal() == 9 || ex.GetExitCode() == 137) && s.mgr.OOMKilled(ctx, sandbox) {
		ex.OomKilled = true
	}
}
