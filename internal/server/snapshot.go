package server

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// SnapshotSandbox makes an image of a sandbox's filesystem.
func (s *Server) SnapshotSandbox(ctx context.Context, req *connect.Request[sbxv1.SnapshotSandboxRequest]) (*connect.Response[sbxv1.SnapshotSandboxResponse], error) {
	if s.images == nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("snapshot: this daemon has no image store"))
	}
	// The image lands in the caller's tenant's store (the manager commits
	// through the stores by ctx); its size is known at the end.
	store, err := s.images.stores.Images(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	if err := s.images.stores.CheckStorage(ctx); err != nil {
		return nil, toConnect(err)
	}
	digest, err := s.mgr.Snapshot(ctx, req.Msg.GetSandbox(), req.Msg.GetTag())
	if err != nil {
		return nil, toConnect(err)
	}
	ref := digest
	if t := req.Msg.GetTag(); t != "" {
		ref = t
	}
	if err := s.images.undoOverQuota(ctx, store, ref); err != nil {
		return nil, err
	}
	img, err := store.Get(ctx, ref)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.SnapshotSandboxResponse{Image: ImageInfo(img)}), nil
}
