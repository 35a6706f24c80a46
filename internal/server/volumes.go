package server

import (
	"context"
	"net/http"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
	"github.com/sbxdev/sbx/internal/volume"
)

// VolumeServer implements sbxv1connect.VolumeServiceHandler over the
// caller's tenant's volumes.
type VolumeServer struct {
	stores Stores
}

var _ sbxv1connect.VolumeServiceHandler = (*VolumeServer)(nil)

// NewVolumeServer returns a VolumeServer over vols.
func NewVolumeServer(stores Stores) *VolumeServer { return &VolumeServer{stores: stores} }

// CreateVolume makes a volume.
func (s *VolumeServer) CreateVolume(ctx context.Context, req *connect.Request[sbxv1.CreateVolumeRequest]) (*connect.Response[sbxv1.CreateVolumeResponse], error) {
	vols, err := s.stores.Volumes(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	size := req.Msg.GetSizeBytes()
	if size == 0 {
		size = volume.DefaultSize
	}
	release, err := s.stores.ReserveStorage(ctx, size)
	if err != nil {
		return nil, toConnect(err)
	}
	defer release()
	v, err := vols.Create(ctx, req.Msg.GetName(), req.Msg.GetSizeBytes())
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.CreateVolumeResponse{Volume: v}), nil
}

// ListVolumes describes every volume.
func (s *VolumeServer) ListVolumes(ctx context.Context, _ *connect.Request[sbxv1.ListVolumesRequest]) (*connect.Response[sbxv1.ListVolumesResponse], error) {
	vols, err := s.stores.Volumes(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	vs, err := vols.List(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.ListVolumesResponse{Volumes: vs}), nil
}

// GetVolume describes one volume.
func (s *VolumeServer) GetVolume(ctx context.Context, req *connect.Request[sbxv1.GetVolumeRequest]) (*connect.Response[sbxv1.GetVolumeResponse], error) {
	vols, err := s.stores.Volumes(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	v, err := vols.Get(ctx, req.Msg.GetName())
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.GetVolumeResponse{Volume: v}), nil
}

// RemoveVolume deletes a volume not in use.
func (s *VolumeServer) RemoveVolume(ctx context.Context, req *connect.Request[sbxv1.RemoveVolumeRequest]) (*connect.Response[sbxv1.RemoveVolumeResponse], error) {
	vols, err := s.stores.Volumes(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	// A destroyed box's teardown unmounts its volumes after the destroy
	// answered: removing the volume right after must not race it.
	s.stores.Settle(ctx)
	if err := vols.Remove(ctx, req.Msg.GetName()); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.RemoveVolumeResponse{}), nil
}

// WithVolumes serves the volume service next to h.
func WithVolumes(h http.Handler, s *VolumeServer) http.Handler {
	mux := http.NewServeMux()
	serveService(mux, func(o ...connect.HandlerOption) (string, http.Handler) {
		return sbxv1connect.NewVolumeServiceHandler(s, o...)
	})
	mux.Handle("/", h)
	return mux
}
