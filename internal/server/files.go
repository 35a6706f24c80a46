package server

import (
	"context"
	"errors"
	"fmt"
	"io"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

var errEOF = io.EOF

func (s *Server) ReadFile(ctx context.Context, req *connect.Request[sbxv1.ReadFileRequest], out *connect.ServerStream[sbxv1.FileChunk]) error {
	conn, release, err := s.mgr.Agent(ctx, req.Msg.GetSandbox())
	if err != nil {
		return toConnect(err)
	}
	defer release()
	st, err := conn.ReadFile(ctx, connect.NewRequest(req.Msg))
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

func (s *Server) DownloadTar(ctx context.Context, req *connect.Request[sbxv1.DownloadTarRequest], out *connect.ServerStream[sbxv1.FileChunk]) error {
	conn, release, err := s.mgr.Agent(ctx, req.Msg.GetSandbox())
	if err != nil {
		return toConnect(err)
	}
	defer release()
	st, err := conn.DownloadTar(ctx, connect.NewRequest(req.Msg))
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

func (s *Server) WriteFile(ctx context.Context, in *connect.ClientStream[sbxv1.WriteFileRequest]) (*connect.Response[sbxv1.WriteFileResponse], error) {
	if !in.Receive() {
		return nil, firstMessageError("write file", in.Err())
	}
	hdr := in.Msg().GetHeader()
	if hdr == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("write file: the first message must be a header"))
	}
	conn, release, err := s.mgr.Agent(ctx, hdr.GetSandbox())
	if err != nil {
		return nil, toConnect(err)
	}
	defer release()
	out := conn.WriteFile(ctx)
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

func (s *Server) UploadTar(ctx context.Context, in *connect.ClientStream[sbxv1.UploadTarRequest]) (*connect.Response[sbxv1.UploadTarResponse], error) {
	if !in.Receive() {
		return nil, firstMessageError("upload tar", in.Err())
	}
	hdr := in.Msg().GetHeader()
	if hdr == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("upload tar: the first message must be a header"))
	}
	conn, release, err := s.mgr.Agent(ctx, hdr.GetSandbox())
	if err != nil {
		return nil, toConnect(err)
	}
	defer release()
	out := conn.UploadTar(ctx)
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

func (s *Server) ListDir(ctx context.Context, req *connect.Request[sbxv1.ListDirRequest]) (*connect.Response[sbxv1.ListDirResponse], error) {
	conn, release, err := s.mgr.Agent(ctx, req.Msg.GetSandbox())
	if err != nil {
		return nil, toConnect(err)
	}
	defer release()
	return conn.ListDir(ctx, connect.NewRequest(req.Msg))
}

func (s *Server) Stat(ctx context.Context, req *connect.Request[sbxv1.StatRequest]) (*connect.Response[sbxv1.StatResponse], error) {
	conn, release, err := s.mgr.Agent(ctx, req.Msg.GetSandbox())
	if err != nil {
		return nil, toConnect(err)
	}
	defer release()
	return conn.Stat(ctx, connect.NewRequest(req.Msg))
}

func (s *Server) MakeDir(ctx context.Context, req *connect.Request[sbxv1.MakeDirRequest]) (*connect.Response[sbxv1.MakeDirResponse], error) {
	conn, release, err := s.mgr.Agent(ctx, req.Msg.GetSandbox())
	if err != nil {
		return nil, toConnect(err)
	}
	defer release()
	return conn.MakeDir(ctx, connect.NewRequest(req.Msg))
}

func (s *Server) Remove(ctx context.Context, req *connect.Request[sbxv1.RemoveRequest]) (*connect.Response[sbxv1.RemoveResponse], error) {
	conn, release, err := s.mgr.Agent(ctx, req.Msg.GetSandbox())
	if err != nil {
		return nil, toConnect(err)
	}
	defer release()
	return conn.Remove(ctx, connect.NewRequest(req.Msg))
}

func (s *Server) Rename(ctx context.Context, req *connect.Request[sbxv1.RenameRequest]) (*connect.Response[sbxv1.RenameResponse], error) {
	conn, release, err := s.mgr.Agent(ctx, req.Msg.GetSandbox())
	if err != nil {
		return nil, toConnect(err)
	}
	defer release()
	return conn.Rename(ctx, connect.NewRequest(req.Msg))
}
