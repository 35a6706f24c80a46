package sbx

import (
	"context"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// Build runs a recipe on the daemon, one sandbox per step, and tags the
// result (if tag is set). Unchanged steps come from the build cache unless
// noCache. progress (may be nil) sees every event: step phases ("running",
// "cached", "done"), step output (log) and statuses. A failing step fails
// the build with the step and its exit code in the error.
func (im *Images) Build(ctx context.Context, recipe *sbxv1.Recipe, tag string, noCache bool, progress func(*sbxv1.ImageProgress)) (*sbxv1.ImageInfo, error) {
	stream, err := im.api.BuildImage(ctx, connect.NewRequest(&sbxv1.BuildImageRequest{Recipe: recipe, Tag: tag, NoCache: noCache}))
	if err != nil {
		return nil, wrap("build", err)
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
	return nil, wrap("build", endedEarly(stream.Err()))
}
