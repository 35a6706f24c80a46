// Package server owns sbx's RPC edge: it implements the sbx.v1
// SandboxService with Connect (gRPC, gRPC-Web and Connect HTTP/JSON on one
// port), forwards exec and file calls to sandbox agents, and is the only
// place where errdefs sentinels become RPC codes. Its Front (front.go) is the
// handler on the daemon's listener: API token checks and the proxy to
// sandbox ports (HTTP, WebSocket, raw TCP) through the manager's agent
// connections. It knows no runtime driver.
package server

import (
	"context"
	"errors"
	"net/http"

	"connectrpc.com/connect"

	"github.com/sbxdev/sbx/api/execframe"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/sandbox"
)

// Version and Commit are stamped at build time with -ldflags.
var (
	Version = "dev"
	Commit  = ""
)

// Server implements sbxv1connect.SandboxServiceHandler.
type Server struct {
	mgr     *sandbox.Manager
	streams *Streams
	images  *ImageServer
	code    *CodeServer
	sess    *SessionServer
	tenants *TenantServer
	observe *ObserveServer
}

var _ sbxv1connect.SandboxServiceHandler = (*Server)(nil)

// New returns a Server over mgr, with the default StreamLimits until
// UseStreams.
func New(mgr *sandbox.Manager) *Server {
	return &Server{mgr: mgr, streams: NewStreams(mgr, StreamLimits{}, nil)}
}

// UseStreams has the server count its exec and file calls in st, which
// the fronts' exec upgrades share.
func (s *Server) UseStreams(st *Streams) { s.streams = st }

// AddImages serves the image service too.
func (s *Server) AddImages(images *ImageServer) { s.images = images }

// compressMinBytes is the smallest message the API compresses for clients
// that accept it. Smaller ones leave as they are: gzip of an exec event cost
// more CPU than the whole rest of its relay, and saves nothing worth having.
const compressMinBytes = 8 << 10

// maxRequestMessage bounds one message a client sends: the daemon reads a
// message whole before it decodes it, so without a bound one message could
// take all its memory. The largest legitimate ones are exec start messages
// with their stdin, which the exec protocol bounds the same way.
const maxRequestMessage = execframe.MaxPayload

// Handler serves the API's services (each procedure with its message bound:
// requestbounds.go), /metrics and /healthz.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	serveService(mux, func(o ...connect.HandlerOption) (string, http.Handler) {
		return sbxv1connect.NewSandboxServiceHandler(s, o...)
	})
	if s.images != nil {
		serveService(mux, func(o ...connect.HandlerOption) (string, http.Handler) {
			return sbxv1connect.NewImageServiceHandler(s.images, o...)
		})
	}
	if s.code != nil {
		serveService(mux, func(o ...connect.HandlerOption) (string, http.Handler) {
			return sbxv1connect.NewCodeServiceHandler(s.code, o...)
		})
	}
	if s.sess != nil {
		serveService(mux, func(o ...connect.HandlerOption) (string, http.Handler) {
			return sbxv1connect.NewSessionServiceHandler(s.sess, o...)
		})
	}
	serveService(mux, func(o ...connect.HandlerOption) (string, http.Handler) {
		return sbxv1connect.NewProcessServiceHandler(&ProcessServer{s: s}, o...)
	})
	if s.tenants != nil {
		serveService(mux, func(o ...connect.HandlerOption) (string, http.Handler) {
			return sbxv1connect.NewTenantServiceHandler(s.tenants, o...)
		})
	}
	if s.observe != nil {
		serveService(mux, func(o ...connect.HandlerOption) (string, http.Handler) {
			return sbxv1connect.NewObserveServiceHandler(s.observe, o...)
		})
		if s.observe.o.Metrics != nil {
			mux.Handle("/metrics", s.observe.o.Metrics.Handler())
		}
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

// toConnect maps an error to a Connect error at the edge. Errors already
// carrying a code (from an agent) pass through.
func toConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	code := connect.CodeInternal
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		code = connect.CodeNotFound
	case errors.Is(err, errdefs.ErrAlreadyExists):
		code = connect.CodeAlreadyExists
	case errors.Is(err, errdefs.ErrInvalidArgument):
		code = connect.CodeInvalidArgument
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		code = connect.CodeFailedPrecondition
	case errors.Is(err, errdefs.ErrResourceExhausted):
		code = connect.CodeResourceExhausted
	case errors.Is(err, errdefs.ErrPermissionDenied):
		code = connect.CodePermissionDenied
	case errors.Is(err, errdefs.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		code = connect.CodeDeadlineExceeded
	case errors.Is(err, errdefs.ErrUnavailable):
		code = connect.CodeUnavailable
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	}
	return connect.NewError(code, collapsed{err})
}

// collapsed is an error whose message reads each layer's prefix once
// (errdefs.CollapseRepeats); errors.Is and As still reach the original.
type collapsed struct{ err error }

func (c collapsed) Error() string { return errdefs.CollapseRepeats(c.err.Error()) }
func (c collapsed) Unwrap() error { return c.err }

func (s *Server) Version(ctx context.Context, _ *connect.Request[sbxv1.VersionRequest]) (*connect.Response[sbxv1.VersionResponse], error) {
	return connect.NewResponse(&sbxv1.VersionResponse{Version: Version, Commit: Commit, Runtimes: s.mgr.Runtimes(ctx)}), nil
}

func (s *Server) CreateSandbox(ctx context.Context, req *connect.Request[sbxv1.CreateSandboxRequest]) (*connect.Response[sbxv1.CreateSandboxResponse], error) {
	sb, err := s.mgr.Create(ctx, req.Msg)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.CreateSandboxResponse{Sandbox: sb}), nil
}

func (s *Server) GetSandbox(ctx context.Context, req *connect.Request[sbxv1.GetSandboxRequest]) (*connect.Response[sbxv1.GetSandboxResponse], error) {
	sb, err := s.mgr.Describe(ctx, req.Msg.GetSandbox(), !req.Msg.GetNoStats())
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.GetSandboxResponse{Sandbox: sb}), nil
}

func (s *Server) ListSandboxes(ctx context.Context, req *connect.Request[sbxv1.ListSandboxesRequest]) (*connect.Response[sbxv1.ListSandboxesResponse], error) {
	list, err := s.mgr.List(ctx, req.Msg.GetSelectors())
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.ListSandboxesResponse{Sandboxes: list}), nil
}

func (s *Server) StopSandbox(ctx context.Context, req *connect.Request[sbxv1.StopSandboxRequest]) (*connect.Response[sbxv1.StopSandboxResponse], error) {
	sb, err := s.mgr.Stop(ctx, req.Msg.GetSandbox())
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.StopSandboxResponse{Sandbox: sb}), nil
}

func (s *Server) StartSandbox(ctx context.Context, req *connect.Request[sbxv1.StartSandboxRequest]) (*connect.Response[sbxv1.StartSandboxResponse], error) {
	sb, err := s.mgr.Start(ctx, req.Msg.GetSandbox())
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.StartSandboxResponse{Sandbox: sb}), nil
}

func (s *Server) DestroySandbox(ctx context.Context, req *connect.Request[sbxv1.DestroySandboxRequest]) (*connect.Response[sbxv1.DestroySandboxResponse], error) {
	destroy := s.mgr.Destroy
	if req.Msg.GetSyncCodebases() {
		destroy = s.mgr.DestroySynced
	}
	if err := destroy(ctx, req.Msg.GetSandbox()); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.DestroySandboxResponse{}), nil
}
