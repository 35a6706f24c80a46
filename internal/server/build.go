package server

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/image"
)

// Builder runs image recipes (internal/builder implements it).
type Builder interface {
	Build(ctx context.Context, req *sbxv1.BuildImageRequest, emit func(*sbxv1.ImageProgress) error) (*image.Image, error)
}

// SetBuilder serves BuildImage with b.
func (s *ImageServer) SetBuilder(b Builder) { s.builder = b }

// BuildImage runs a recipe, streaming step phases and step output; the last
// event is `done` with the built image.
func (s *ImageServer) BuildImage(ctx context.Context, req *connect.Request[sbxv1.BuildImageRequest], out *connect.ServerStream[sbxv1.ImageProgress]) error {
	if s.builder == nil {
		return connect.NewError(connect.CodeUnimplemented, errors.New("this daemon cannot build images"))
	}
	// The build's images go to the caller's tenant's store (the builder
	// picks it by ctx), its step sandboxes are the tenant's.
	store, err := s.stores.Images(ctx)
	if err != nil {
		return toConnect(err)
	}
	if err := s.stores.CheckStorage(ctx); err != nil {
		return toConnect(err)
	}
	img, err := s.builder.Build(ctx, req.Msg, out.Send)
	if err != nil {
		return toConnect(err)
	}
	if err := s.undoOverQuota(ctx, store, img.Digest); err != nil {
		return err
	}
	return out.Send(&sbxv1.ImageProgress{Event: &sbxv1.ImageProgress_Done{Done: ImageInfo(img)}})
}
