package sbx

import (
	"context"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// VolumeMount mounts the named volume at Path in a sandbox.
type VolumeMount struct {
	Volume   string
	Path     string
	ReadOnly bool
}

// Proto converts the mount to its API message.
func (v VolumeMount) Proto() *sbxv1.VolumeMount {
	return &sbxv1.VolumeMount{Volume: v.Volume, Path: v.Path, ReadOnly: v.ReadOnly}
}

// CreateVolume makes a named persistent volume of sizeBytes (0: the
// daemon's default).
func (c *Client) CreateVolume(ctx context.Context, name string, sizeBytes int64) (*sbxv1.Volume, error) {
	resp, err := c.volumes.CreateVolume(ctx, connect.NewRequest(&sbxv1.CreateVolumeRequest{Name: name, SizeBytes: sizeBytes}))
	if err != nil {
		return nil, wrap("create volume "+name, err)
	}
	return resp.Msg.GetVolume(), nil
}

// GetVolume describes a volume.
func (c *Client) GetVolume(ctx context.Context, name string) (*sbxv1.Volume, error) {
	resp, err := c.volumes.GetVolume(ctx, connect.NewRequest(&sbxv1.GetVolumeRequest{Name: name}))
	if err != nil {
		return nil, wrap("get volume "+name, err)
	}
	return resp.Msg.GetVolume(), nil
}

// ListVolumes describes every volume.
func (c *Client) ListVolumes(ctx context.Context) ([]*sbxv1.Volume, error) {
	resp, err := c.volumes.ListVolumes(ctx, connect.NewRequest(&sbxv1.ListVolumesRequest{}))
	if err != nil {
		return nil, wrap("list volumes", err)
	}
	return resp.Msg.GetVolumes(), nil
}

// RemoveVolume deletes a volume and its data; it fails while a sandbox uses it.
func (c *Client) RemoveVolume(ctx context.Context, name string) error {
	_, err := c.volumes.RemoveVolume(ctx, connect.NewRequest(&sbxv1.RemoveVolumeRequest{Name: name}))
	return wrap("remove volume "+name, err)
}
