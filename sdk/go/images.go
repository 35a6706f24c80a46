package sbx

import (
	"context"
	"io"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
)

// Images returns the image part of the client.
func (c *Client) Images() *Images { return &Images{api: c.images} }

// Images manages the daemon's OCI images.
type Images struct {
	api sbxv1connect.ImageServiceClient
}

// Pull fetches ref from its registry; progress (may be nil) sees each event.
func (im *Images) Pull(ctx context.Context, ref string, progress func(*sbxv1.ImageProgress)) (*sbxv1.ImageInfo, error) {
	stream, err := im.api.PullImage(ctx, connect.NewRequest(&sbxv1.PullImageRequest{Ref: ref}))
	if err != nil {
		return nil, wrap("pull "+ref, err)
	}
	defer stream.Close()
	for stream.Receive() {
		ev := stream.Msg()
		if progress != nil {
			progress(ev)
		}
		if done := ev.GetDone(); done != nil {
			return done, nil
		}
	}
	return nil, wrap("pull "+ref, endedEarly(stream.Err()))
}

// Import reads a docker-save or OCI-layout tarball; tag (optional) names a
// single-image archive.
func (im *Images) Import(ctx context.Context, r io.Reader, tag string) ([]*sbxv1.ImageInfo, error) {
	stream := im.api.ImportImage(ctx)
	hdr := &sbxv1.ImportImageRequest{Msg: &sbxv1.ImportImageRequest_Header{Header: &sbxv1.ImportImageHeader{Tag: tag}}}
	if err := sendChunks(stream.Send, hdr, r, func(b []byte) *sbxv1.ImportImageRequest {
		return &sbxv1.ImportImageRequest{Msg: &sbxv1.ImportImageRequest_Data{Data: b}}
	}); err != nil {
		stream.CloseAndReceive() //nolint:errcheck
		return nil, wrap("import image", err)
	}
	resp, err := stream.CloseAndReceive()
	if err != nil {
		return nil, wrap("import image", err)
	}
	return resp.Msg.GetImages(), nil
}

// Export writes ref as a docker-save tarball to w.
func (im *Images) Export(ctx context.Context, ref string, w io.Writer) error {
	stream, err := im.api.ExportImage(ctx, connect.NewRequest(&sbxv1.ExportImageRequest{Ref: ref}))
	if err != nil {
		return wrap("export "+ref, err)
	}
	defer stream.Close()
	for stream.Receive() {
		if _, err := w.Write(stream.Msg().GetData()); err != nil {
			return err
		}
	}
	return wrap("export "+ref, stream.Err())
}

// List returns every stored image and the bytes all layers take on disk.
func (im *Images) List(ctx context.Context) ([]*sbxv1.ImageInfo, int64, error) {
	resp, err := im.api.ListImages(ctx, connect.NewRequest(&sbxv1.ListImagesRequest{}))
	if err != nil {
		return nil, 0, wrap("list images", err)
	}
	return resp.Msg.GetImages(), resp.Msg.GetLayersBytes(), nil
}

// Get describes one image (by reference or digest).
func (im *Images) Get(ctx context.Context, ref string) (*sbxv1.ImageInfo, error) {
	resp, err := im.api.GetImage(ctx, connect.NewRequest(&sbxv1.GetImageRequest{Ref: ref}))
	if err != nil {
		return nil, wrap("get image "+ref, err)
	}
	return resp.Msg.GetImage(), nil
}

// Tag gives an image another reference.
func (im *Images) Tag(ctx context.Context, source, target string) error {
	_, err := im.api.TagImage(ctx, connect.NewRequest(&sbxv1.TagImageRequest{Source: source, Target: target}))
	return wrap("tag "+source, err)
}

// Remove untags an image; Prune then frees its layers.
func (im *Images) Remove(ctx context.Context, ref string) error {
	_, err := im.api.RemoveImage(ctx, connect.NewRequest(&sbxv1.RemoveImageRequest{Ref: ref}))
	return wrap("remove image "+ref, err)
}

// Prune deletes layers no image or sandbox uses and returns the bytes freed.
func (im *Images) Prune(ctx context.Context) (int64, error) {
	resp, err := im.api.PruneImages(ctx, connect.NewRequest(&sbxv1.PruneImagesRequest{}))
	if err != nil {
		return 0, wrap("prune images", err)
	}
	return resp.Msg.GetFreedBytes(), nil
}
