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
// single-image archive. The names the archive itself carries are not
// applied (see ImportWith).
func (im *Images) Import(ctx context.Context, r io.Reader, tag string) ([]*sbxv1.ImageInfo, error) {
	resp, err := im.ImportWith(ctx, r, ImportOptions{Tag: tag})
	if err != nil {
		return nil, err
	}
	return resp.GetImages(), nil
}

// ImportOptions says how ImportWith names the imported images.
type ImportOptions struct {
	// Tag names the archive's one image (an archive with more is refused).
	// It must be a valid tag reference; if it names another image already,
	// it is moved to this one.
	Tag string
	// UseArchiveTags applies the names inside the archive (docker-save
	// RepoTags, OCI layout annotations) too. The archive's author chose
	// them: each must be a valid tag reference, and one that names another
	// image already fails the import (AlreadyExists) unless
	// ReplaceArchiveTags. Without it they are only reported
	// (ImportImageResponse.ArchiveNames).
	UseArchiveTags     bool
	ReplaceArchiveTags bool
}

// ImportWith reads a docker-save or OCI-layout tarball and returns the
// images stored and, for each, the names the archive gives it.
func (im *Images) ImportWith(ctx context.Context, r io.Reader, opts ImportOptions) (*sbxv1.ImportImageResponse, error) {
	stream := im.api.ImportImage(ctx)
	hdr := &sbxv1.ImportImageRequest{Msg: &sbxv1.ImportImageRequest_Header{Header: &sbxv1.ImportImageHeader{
		Tag: opts.Tag, UseArchiveTags: opts.UseArchiveTags, ReplaceArchiveTags: opts.ReplaceArchiveTags}}}
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
	return resp.Msg, nil
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

// Ensure makes sure ref is in the daemon's image store, pulling it (with
// progress, which may be nil) when it is not, and returns it. Creating a
// sandbox from a missing image pulls it anyway; Ensure first is how a
// caller sees the pull's progress. "host" and "" (the built-in image) are
// always there: Ensure returns nil, nil for them, and for a caller whose
// token may not see images (a scoped sandbox token), whose create then
// says what is missing.
func (im *Images) Ensure(ctx context.Context, ref string, progress func(*sbxv1.ImageProgress)) (*sbxv1.ImageInfo, error) {
	if ref == "" || ref == "host" {
		return nil, nil
	}
	img, err := im.Get(ctx, ref)
	switch {
	case err == nil:
		return img, nil
	case codeOf(err) == connect.CodePermissionDenied:
		return nil, nil
	case !IsNotFound(err):
		return nil, err
	}
	return im.Pull(ctx, ref, progress)
}
