package sbx

import (
	"context"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// Snapshot makes an image of the sandbox's filesystem (its image plus its
// changes), tagged tag, with the sandbox's env, workdir and user as the
// image's config. The sandbox is frozen while its changes are read and
// keeps running afterwards. Sandboxes of the built-in host image cannot be
// snapshotted yet.
func (s *Sandbox) Snapshot(ctx context.Context, tag string) (*sbxv1.ImageInfo, error) {
	resp, err := s.c.api.SnapshotSandbox(ctx, connect.NewRequest(&sbxv1.SnapshotSandboxRequest{Sandbox: s.ID, Tag: tag}))
	if err != nil {
		return nil, wrap("snapshot sandbox "+s.ID, err)
	}
	return resp.Msg.GetImage(), nil
}
