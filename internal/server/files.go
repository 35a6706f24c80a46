package server

import (
	"context"
	"errors"
	"fmt"
	"io"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/agentconn"
)

// serverStream forwards a server-streaming call to the agent of the named sandbox.
func serverStream[Req, Resp any](ctx context.Context, s *Server, sandbox string, req *connect.Request[Req], out *connect.ServerStream[Resp],
	call func(*agentconn.Conn, context.Context, *connect.Request[Req]) (*connect.ServerStreamForClient[Resp], error)) error {
	conn, release, err := s.streams.file(ctx, sandbox)
	if err != nil {
		return err
	}
	defer release()
	st, err := call(conn, ctx, connect.NewRequest(req.Msg))
	if err != nil {
		return err
	}
	defer st.Close()
	for st.Receive() {
		if err := out.Send(st.Msg()); err != nil {
			return err
		}
	}
	return st.Err()
}

func (s *Server) ReadFile(ctx context.Context, req *connect.Request[sbxv1.ReadFileRequest], out *connect.ServerStream[sbxv1.FileChunk]) error {
	return serverStream(ctx, s, req.Msg.GetSandbox(), req, out, (*agentconn.Conn).ReadFile)
}

func (s *Server) DownloadTar(ctx context.Context, req *connect.Request[sbxv1.DownloadTarRequest], out *connect.ServerStream[sbxv1.FileChunk]) error {
	return serverStream(ctx, s, req.Msg.GetSandbox(), req, out, (*agentconn.Conn).DownloadTar)
}

// clientStream forwards a client-streaming upload whose first message names
// the sandbox (header returns that message's header, or nil).
func clientStream[Req any, Hdr interface {
	comparable
	GetSandbox() string
}, Resp any](ctx context.Context, s *Server, what string,
	in *connect.ClientStream[Req], header func(*Req) Hdr,
	call func(*agentconn.Conn, context.Context) *connect.ClientStreamForClient[Req, Resp]) (*connect.Response[Resp], error) {
	if !in.Receive() {
		return nil, firstMessageError(what, in.Err())
	}
	hdr := header(in.Msg())
	var none Hdr
	if hdr == none {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s: the first message must be a header", what))
	}
	conn, release, err := s.streams.file(ctx, hdr.GetSandbox())
	if err != nil {
		return nil, err
	}
	defer release()
	out := call(conn, ctx)
	if err := relay(in, out.Send); err != nil {
		out.CloseAndReceive() //nolint:errcheck // already failing
		return nil, err
	}
	resp, err := out.CloseAndReceive()
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp.Msg), nil
}

func (s *Server) WriteFile(ctx context.Context, in *connect.ClientStream[sbxv1.WriteFileRequest]) (*connect.Response[sbxv1.WriteFileResponse], error) {
	return clientStream(ctx, s, "write file", in, (*sbxv1.WriteFileRequest).GetHeader, (*agentconn.Conn).WriteFile)
}

func (s *Server) UploadTar(ctx context.Context, in *connect.ClientStream[sbxv1.UploadTarRequest]) (*connect.Response[sbxv1.UploadTarResponse], error) {
	return clientStream(ctx, s, "upload tar", in, (*sbxv1.UploadTarRequest).GetHeader, (*agentconn.Conn).UploadTar)
}

func firstMessageError(what string, err error) error {
	if err == nil {
		err = errors.New("empty request stream")
	}
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s: reading the header: %w", what, err))
}

// relay sends the already-received first message of in, then the rest.
func relay[T any](in *connect.ClientStream[T], send func(*T) error) error {
	for {
		if err := send(in.Msg()); err != nil {
			if errors.Is(err, io.EOF) {
				// The agent ended the stream (e.g. with an error); CloseAndReceive reports it.
				return nil
			}
			return err
		}
		if !in.Receive() {
			return in.Err()
		}
	}
}

// unary forwards a unary call to the agent of the named sandbox.
func unary[Req, Resp any](ctx context.Context, s *Server, sandbox string, req *connect.Request[Req],
	call func(*agentconn.Conn, context.Context, *connect.Request[Req]) (*connect.Response[Resp], error)) (*connect.Response[Resp], error) {
	conn, release, err := s.streams.file(ctx, sandbox)
	if err != nil {
		return nil, err
	}
	defer release()
	return call(conn, ctx, connect.NewRequest(req.Msg))
}

func (s *Server) ListDir(ctx context.Context, req *connect.Request[sbxv1.ListDirRequest]) (*connect.Response[sbxv1.ListDirResponse], error) {
	return unary(ctx, s, req.Msg.GetSandbox(), req, (*agentconn.Conn).ListDir)
}

func (s *Server) Stat(ctx context.Context, req *connect.Request[sbxv1.StatRequest]) (*connect.Response[sbxv1.StatResponse], error) {
	return unary(ctx, s, req.Msg.GetSandbox(), req, (*agentconn.Conn).Stat)
}

func (s *Server) MakeDir(ctx context.Context, req *connect.Request[sbxv1.MakeDirRequest]) (*connect.Response[sbxv1.MakeDirResponse], error) {
	return unary(ctx, s, req.Msg.GetSandbox(), req, (*agentconn.Conn).MakeDir)
}

func (s *Server) Remove(ctx context.Context, req *connect.Request[sbxv1.RemoveRequest]) (*connect.Response[sbxv1.RemoveResponse], error) {
	return unary(ctx, s, req.Msg.GetSandbox(), req, (*agentconn.Conn).Remove)
}

func (s *Server) Rename(ctx context.Context, req *connect.Request[sbxv1.RenameRequest]) (*connect.Response[sbxv1.RenameResponse], error) {
	return unary(ctx, s, req.Msg.GetSandbox(), req, (*agentconn.Conn).Rename)
}
