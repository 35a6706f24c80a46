package server

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
	"github.com/sbxdev/sbx/internal/codebase"
	"github.com/sbxdev/sbx/internal/sandbox"
)

// CodebaseServer implements sbxv1connect.CodebaseServiceHandler.
type CodebaseServer struct {
	cbs *codebase.Manager
	mgr *sandbox.Manager
}

var _ sbxv1connect.CodebaseServiceHandler = (*CodebaseServer)(nil)

// NewCodebaseServer returns a CodebaseServer over cbs; syncs go through
// mgr (which freezes the sandbox).
func NewCodebaseServer(cbs *codebase.Manager, mgr *sandbox.Manager) *CodebaseServer {
	return &CodebaseServer{cbs: cbs, mgr: mgr}
}

// CreateCodebase extracts an uploaded tar into a new codebase.
func (s *CodebaseServer) CreateCodebase(ctx context.Context, in *connect.ClientStream[sbxv1.CreateCodebaseRequest]) (*connect.Response[sbxv1.CreateCodebaseResponse], error) {
	if !in.Receive() {
		return nil, firstMessageError("create codebase", in.Err())
	}
	hdr := in.Msg().GetHeader()
	if hdr == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("create codebase: the first message must be a header"))
	}
	pr, pw := io.Pipe()
	go func() {
		for in.Receive() {
			if _, err := pw.Write(in.Msg().GetData()); err != nil {
				return
			}
		}
		pw.CloseWithError(in.Err())
	}()
	cb, skipped, err := s.cbs.Create(ctx, hdr, pr)
	pr.CloseWithError(errors.New("create codebase finished"))
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.CreateCodebaseResponse{Codebase: cb, Skipped: skipped}), nil
}

// ListCodebases describes every codebase.
func (s *CodebaseServer) ListCodebases(ctx context.Context, _ *connect.Request[sbxv1.ListCodebasesRequest]) (*connect.Response[sbxv1.ListCodebasesResponse], error) {
	cbs, err := s.cbs.List(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.ListCodebasesResponse{Codebases: cbs}), nil
}

// GetCodebase describes one codebase.
func (s *CodebaseServer) GetCodebase(ctx context.Context, req *connect.Request[sbxv1.GetCodebaseRequest]) (*connect.Response[sbxv1.GetCodebaseResponse], error) {
	cb, err := s.cbs.Get(ctx, req.Msg.GetCodebase())
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.GetCodebaseResponse{Codebase: cb}), nil
}

// DownloadCodebase streams the current revision as a tar.
func (s *CodebaseServer) DownloadCodebase(ctx context.Context, req *connect.Request[sbxv1.DownloadCodebaseRequest], out *connect.ServerStream[sbxv1.FileChunk]) error {
	bw := bufio.NewWriterSize(chunkWriter{send: out.Send}, 256<<10)
	if err := s.cbs.Download(ctx, req.Msg.GetCodebase(), bw); err != nil {
		return toConnect(err)
	}
	return toConnect(bw.Flush())
}

// DeleteCodebase removes a codebase no sandbox mounts.
func (s *CodebaseServer) DeleteCodebase(ctx context.Context, req *connect.Request[sbxv1.DeleteCodebaseRequest]) (*connect.Response[sbxv1.DeleteCodebaseResponse], error) {
	// A destroyed box's teardown unmounts its codebases after the destroy
	// answered: deleting the codebase right after must not race it.
	settle(ctx, s.mgr)
	if err := s.cbs.Delete(ctx, req.Msg.GetCodebase()); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.DeleteCodebaseResponse{}), nil
}

// SyncCodebase writes a sandbox's changes back.
func (s *CodebaseServer) SyncCodebase(ctx context.Context, req *connect.Request[sbxv1.SyncCodebaseRequest]) (*connect.Response[sbxv1.SyncCodebaseResponse], error) {
	m := req.Msg
	resp, err := s.mgr.SyncCodebase(ctx, m.GetSandbox(), m.GetPath(), m.GetDryRun(), m.GetForce())
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(resp), nil
}

// WithCodebases serves the codebase service next to h.
func WithCodebases(h http.Handler, s *CodebaseServer) http.Handler {
	mux := http.NewServeMux()
	serveService(mux, func(o ...connect.HandlerOption) (string, http.Handler) {
		return sbxv1connect.NewCodebaseServiceHandler(s, o...)
	})
	mux.Handle("/", h)
	return mux
}
