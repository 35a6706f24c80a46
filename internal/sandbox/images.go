package sandbox

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"connectrpc.com/connect"

	agentv1 "github.com/sbxdev/sbx/api/gen/agent/v1"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/agentconn"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
)

// Images resolves image references to unpacked layers. The daemon adapts
// internal/image to it; a nil Images means only the built-in host image.
type Images interface {
	// Resolve finds an image and holds it against garbage collection until
	// release is called; the manager releases it once the sandbox counts
	// in ImagesInUse.
	Resolve(ctx context.Context, ref string) (img *ResolvedImage, release func(), err error)
}

// ResolvedImage is what a sandbox needs of an image.
type ResolvedImage struct {
	Ref    string
	Digest string
	// Layers are the image's unpacked layers, lowest first.
	Layers     []runtime.Layer
	Env        []string
	Workdir    string
	User       string
	Entrypoint []string
	Cmd        []string
	// OnHost: the layers stack on the built-in host image (a snapshot of a
	// host sandbox), or, with no layers, it is the host image.
	OnHost bool
}

// OnHostLabel marks images whose layers stack on the built-in host image.
const OnHostLabel = "dev.sbx.base"

// HostImage is the built-in image: the host's /usr, read-only.
const HostImage = "host"

// resolveImage looks the sandbox's image up and folds its config into spec:
// image env under the request's, the image's workdir and user unless the
// request sets them, and the entrypoint in front of a requested command.
func (m *Manager) resolveImage(ctx context.Context, spec *sbxv1.CreateSandboxRequest) (*ResolvedImage, func(), error) {
	if spec.Image == "" || spec.Image == HostImage {
		spec.Image = HostImage
		return &ResolvedImage{Ref: HostImage, OnHost: true}, func() {}, nil
	}
	if m.cfg.Images == nil {
		return nil, nil, fmt.Errorf("image %q: this daemon has no image store: %w", spec.Image, errdefs.ErrNotFound)
	}
	img, release, err := m.cfg.Images.Resolve(ctx, spec.Image)
	if err != nil {
		return nil, nil, err
	}
	env := map[string]string{}
	for _, kv := range img.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && envKeyRe.MatchString(k) {
			env[k] = v
		}
	}
	for k, v := range spec.Env {
		env[k] = v
	}
	if len(env) > 0 {
		spec.Env = env
	}
	if spec.Workdir == "" {
		spec.Workdir = img.Workdir
	}
	if spec.User == "" {
		spec.User = img.User
	}
	spec.Command = imageCommand(spec, img)
	return img, release, nil
}

// imageCommand is the command a sandbox of img runs, as docker run has it:
// the request's command after the image's ENTRYPOINT, or with none the
// ENTRYPOINT and CMD. With no_entrypoint only the request's command.
func imageCommand(spec *sbxv1.CreateSandboxRequest, img *ResolvedImage) []string {
	switch {
	case spec.GetNoEntrypoint():
		return spec.Command
	case len(spec.Command) > 0:
		return append(slices.Clone(img.Entrypoint), spec.Command...)
	default:
		return append(slices.Clone(img.Entrypoint), img.Cmd...)
	}
}

// configure hands the agent of a box the sandbox's defaults (env, the
// environment the box was made with) and path policies (it mounts the
// guards first) and starts its command (as the sandbox's user). A command
// that cannot start (not found, not executable, a workdir that cannot be
// made) fails it with the agent's error, which names the command.
func configure(ctx context.Context, conn *agentconn.Conn, env []string, spec *sbxv1.CreateSandboxRequest) error {
	_, err := conn.Configure(ctx, connect.NewRequest(&agentv1.ConfigureRequest{
		Env: env, Workdir: spec.Workdir, Command: spec.Command, User: spec.User,
		PathPolicies: spec.PathPolicies,
	}))
	if err != nil {
		return fmt.Errorf("configure sandbox agent: %w", err)
	}
	return nil
}

// ImagesInUse returns the digests of the images tenant's live sandboxes
// started from (each tenant has an image store of its own).
func (m *Manager) ImagesInUse(tenant string) map[string]bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := map[string]bool{}
	for _, b := range m.boxes {
		b.addImage(tenant, out)
	}
	m.dyingImages(tenant, out)
	return out
}

// addImage adds to out the digest of the image b started from, if b is
// tenant's.
func (b *box) addImage(tenant string, out map[string]bool) {
	if b.tenant != tenant {
		return
	}
	b.mu.Lock()
	if d := b.rec.ImageDigest; d != "" {
		out[d] = true
	}
	b.mu.Unlock()
}
