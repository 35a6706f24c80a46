package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
	"github.com/sbxdev/sbx/internal/image"
	"github.com/sbxdev/sbx/internal/volume"
)

// Stores gives each request's tenant an image store and volumes of its
// own (the daemon's per-tenant stores; the single-user owner has one of
// each), and holds the tenant to its storage quota.
type Stores interface {
	Images(ctx context.Context) (*image.Store, error)
	Volumes(ctx context.Context) (*volume.Manager, error)
	// CheckStorage fails (ResourceExhausted, naming the quota) when ctx's
	// tenant holds more than its storage quota.
	CheckStorage(ctx context.Context) error
	// ReserveStorage admits add more bytes of ctx's tenant until release.
	ReserveStorage(ctx context.Context, add int64) (release func(), err error)
	// InUse returns the digests of images ctx's tenant's sandboxes use.
	InUse(ctx context.Context) map[string]bool
	// Settle waits (within ctx) until the sandboxes destroyed so far are
	// torn down: a destroy answers before its box's mounts are gone, and
	// what was in use only by such a box is free again after Settle.
	Settle(ctx context.Context)
}

// ImageServer implements sbxv1connect.ImageServiceHandler over the
// caller's tenant's image store. What adds images (pulls, imports, builds,
// snapshots) checks the tenant's storage quota before it starts and, its
// size known only at the end, removes what it added again if that took the
// tenant over (undoOverQuota). Nothing is serialised across tenants.
type ImageServer struct {
	stores Stores
	// gc is held for writing while pruning, for reading while a create
	// resolves an image and registers its sandbox.
	gc *sync.RWMutex
	// builder serves BuildImage (nil: Unimplemented).
	builder Builder
}

var _ sbxv1connect.ImageServiceHandler = (*ImageServer)(nil)

// NewImageServer returns the image service.
func NewImageServer(stores Stores, gc *sync.RWMutex) *ImageServer {
	return &ImageServer{stores: stores, gc: gc}
}

// undoOverQuota removes images refs again if adding them took ctx's
// tenant past its storage_bytes quota (see the function undoOverQuota);
// the error is the API's.
func (s *ImageServer) undoOverQuota(ctx context.Context, store *image.Store, refs ...string) error {
	return toConnect(undoOverQuota(ctx, s.stores, s.gc, store, refs...))
}

// layersInUse are the layers of the images ctx's tenant's sandboxes use.
func (s *ImageServer) layersInUse(ctx context.Context, store *image.Store) map[string]bool {
	return layersInUse(ctx, s.stores, store)
}

// ImageInfo converts a stored image to its API form.
func ImageInfo(img *image.Image) *sbxv1.ImageInfo {
	c := img.Config
	return &sbxv1.ImageInfo{
		Ref: img.Ref, Digest: img.Digest, SizeBytes: img.Size, Layers: int32(len(img.Layers)),
		CreatedAtMs: img.Created.UnixMilli(),
		Config: &sbxv1.ImageConfig{
			Env: c.Env, Workdir: c.WorkingDir, User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd, Labels: c.Labels,
		},
	}
}

func progressEvent(p image.Progress) *sbxv1.ImageProgress {
	return &sbxv1.ImageProgress{Event: &sbxv1.ImageProgress_Layer{Layer: &sbxv1.LayerProgress{
		Digest: p.Layer, CurrentBytes: p.Current, TotalBytes: p.Total, Phase: p.Status,
	}}}
}

func (s *ImageServer) PullImage(ctx context.Context, req *connect.Request[sbxv1.PullImageRequest], out *connect.ServerStream[sbxv1.ImageProgress]) error {
	ref := req.Msg.GetRef()
	if ref == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("pull: no image reference given"))
	}
	if err := out.Send(&sbxv1.ImageProgress{Event: &sbxv1.ImageProgress_Status{Status: "pulling " + ref}}); err != nil {
		return err
	}
	var sendErr error
	img, err := NewPuller(s.stores, s.gc).Pull(ctx, ref, func(p image.Progress) {
		if sendErr == nil {
			sendErr = out.Send(progressEvent(p))
		}
	})
	if err != nil {
		return toConnect(err)
	}
	if sendErr != nil {
		return sendErr
	}
	return out.Send(&sbxv1.ImageProgress{Event: &sbxv1.ImageProgress_Done{Done: ImageInfo(img)}})
}

func (s *ImageServer) ImportImage(ctx context.Context, in *connect.ClientStream[sbxv1.ImportImageRequest]) (*connect.Response[sbxv1.ImportImageResponse], error) {
	if !in.Receive() {
		return nil, firstMessageError("import image", in.Err())
	}
	hdr := in.Msg().GetHeader()
	if hdr == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("import image: the first message must be a header"))
	}
	store, err := s.stores.Images(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	if err := s.stores.CheckStorage(ctx); err != nil {
		return nil, toConnect(err)
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
	opts := image.ImportOptions{UseArchiveTags: hdr.GetUseArchiveTags(), ReplaceArchiveTags: hdr.GetReplaceArchiveTags()}
	if tag := hdr.GetTag(); tag != "" {
		opts.Tags = []string{tag}
	}
	res, err := store.Import(ctx, pr, opts)
	pr.CloseWithError(errors.New("import finished"))
	if err != nil {
		return nil, toConnect(err)
	}
	var refs []string
	for _, r := range res {
		refs = append(refs, r.Image.Digest)
	}
	if err := s.undoOverQuota(ctx, store, refs...); err != nil {
		return nil, err
	}
	resp := &sbxv1.ImportImageResponse{}
	for _, r := range res {
		resp.Images = append(resp.Images, ImageInfo(r.Image))
		resp.ArchiveNames = append(resp.ArchiveNames, &sbxv1.ArchiveNames{Tags: r.ArchiveTags, Rejected: r.RejectedTags})
	}
	return connect.NewResponse(resp), nil
}

// chunkWriter turns writes into FileChunk messages.
type chunkWriter struct {
	send func(*sbxv1.FileChunk) error
}

func (w chunkWriter) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += 256 << 10 {
		end := min(off+256<<10, len(p))
		if err := w.send(&sbxv1.FileChunk{Data: append([]byte(nil), p[off:end]...)}); err != nil {
			return off, err
		}
	}
	return len(p), nil
}

func (s *ImageServer) ExportImage(ctx context.Context, req *connect.Request[sbxv1.ExportImageRequest], out *connect.ServerStream[sbxv1.FileChunk]) error {
	store, err := s.stores.Images(ctx)
	if err != nil {
		return toConnect(err)
	}
	return toConnect(store.Export(ctx, req.Msg.GetRef(), chunkWriter{send: out.Send}))
}

func (s *ImageServer) ListImages(ctx context.Context, _ *connect.Request[sbxv1.ListImagesRequest]) (*connect.Response[sbxv1.ListImagesResponse], error) {
	store, err := s.stores.Images(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	imgs, err := store.List(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	_, _, bytes, err := store.DiskUsage(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	resp := &sbxv1.ListImagesResponse{LayersBytes: bytes}
	for _, img := range imgs {
		resp.Images = append(resp.Images, ImageInfo(img))
	}
	return connect.NewResponse(resp), nil
}

func (s *ImageServer) GetImage(ctx context.Context, req *connect.Request[sbxv1.GetImageRequest]) (*connect.Response[sbxv1.GetImageResponse], error) {
	store, err := s.stores.Images(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	img, err := store.Get(ctx, req.Msg.GetRef())
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.GetImageResponse{Image: ImageInfo(img)}), nil
}

func (s *ImageServer) TagImage(ctx context.Context, req *connect.Request[sbxv1.TagImageRequest]) (*connect.Response[sbxv1.TagImageResponse], error) {
	store, err := s.stores.Images(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	if err := store.Tag(ctx, req.Msg.GetSource(), req.Msg.GetTarget()); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.TagImageResponse{}), nil
}

func (s *ImageServer) RemoveImage(ctx context.Context, req *connect.Request[sbxv1.RemoveImageRequest]) (*connect.Response[sbxv1.RemoveImageResponse], error) {
	store, err := s.stores.Images(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	s.stores.Settle(ctx)
	s.gc.Lock()
	defer s.gc.Unlock()
	img, err := store.Get(ctx, req.Msg.GetRef())
	if err != nil {
		return nil, toConnect(err)
	}
	if s.stores.InUse(ctx)[img.Digest] {
		return nil, connect.NewError(connect.CodeFailedPrecondition,
			fmt.Errorf("image %s is used by a sandbox; destroy it first", req.Msg.GetRef()))
	}
	if err := store.Remove(ctx, req.Msg.GetRef()); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.RemoveImageResponse{}), nil
}

func (s *ImageServer) PruneImages(ctx context.Context, _ *connect.Request[sbxv1.PruneImagesRequest]) (*connect.Response[sbxv1.PruneImagesResponse], error) {
	store, err := s.stores.Images(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	s.stores.Settle(ctx)
	s.gc.Lock()
	defer s.gc.Unlock()
	freed, err := store.Prune(ctx, s.layersInUse(ctx, store))
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&sbxv1.PruneImagesResponse{FreedBytes: freed}), nil
}
