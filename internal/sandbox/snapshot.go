package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
)

// ImageCommitter is implemented by an Images that can make images of
// sandbox filesystems (the daemon's adapter of internal/image does).
type ImageCommitter interface {
	// Commit stores layer (an uncompressed layer tar) on top of the image
	// with digest base and returns the new image's digest, tagged tag
	// unless it is empty. Entrypoint, cmd and labels come from base.
	Commit(ctx context.Context, base string, layer io.Reader, cfg SnapshotConfig, tag string) (digest string, err error)
}

// SnapshotConfig is what a sandbox passes on to an image made of it.
type SnapshotConfig struct {
	Env     []string // KEY=VALUE, sorted; secrets are never included
	Workdir string
	User    string
	// Labels are added to the image's labels (OnHostLabel for host sandboxes).
	Labels map[string]string
}

// Diff writes the filesystem changes of a running or stopped sandbox (its
// writable layer) to w as an uncompressed OCI layer tar. It is serialised
// with the sandbox's other lifecycle operations; the box is frozen while
// its layer is read.
func (m *Manager) Diff(ctx context.Context, ref string, w io.Writer) error {
	b, err := m.lookup(ctx, ref)
	if err != nil {
		return err
	}
	b.opMu.Lock()
	defer b.opMu.Unlock()
	return m.diffLocked(ctx, b, w)
}

// diffLocked is Diff with b.opMu held.
func (m *Manager) diffLocked(ctx context.Context, b *box, w io.Writer) error {
	switch st := b.state(); st {
	case sbxv1.SandboxState_SANDBOX_STATE_RUNNING, sbxv1.SandboxState_SANDBOX_STATE_STOPPED:
	default:
		return b.notRunning(st)
	}
	if err := b.require(ctx, runtime.CapSnapshot, "snapshots and diffs of a sandbox's files"); err != nil {
		return err
	}
	snap, ok := b.driver.(runtime.Snapshotter)
	if !ok {
		return fmt.Errorf("runtime %q declares %q but cannot snapshot sandboxes: %w", b.driver.Name(), runtime.CapSnapshot, errdefs.ErrFailedPrecondition)
	}
	b.busy.Add(1)
	defer b.busy.Add(-1)
	b.mu.Lock()
	h := b.handle
	b.mu.Unlock()
	return snap.Diff(ctx, h, w, m.diffLimits(b))
}

// diffLimits bounds what a diff copies out of b: its data by b's own disk
// limit, its apparent size (sparse files' holes included) by the daemon's
// layer cap.
func (m *Manager) diffLimits(b *box) runtime.DiffLimits {
	lim := runtime.DiffLimits{
		DataBytes: b.spec().GetResources().GetDiskBytes(),
		DataWhat:  fmt.Sprintf("sandbox %s's disk limit (%s)", b.id, FormatBytes(b.spec().GetResources().GetDiskBytes())),
	}
	if c := m.cfg.MaxLayerBytes; c > 0 {
		lim.ApparentBytes = c
		lim.ApparentWhat = fmt.Sprintf("the daemon's largest layer (%s, sbx serve --max-layer-size)", FormatBytes(c))
	}
	return lim
}

// errCommitEnded ends a snapshot's diff when its commit returned first.
var errCommitEnded = errors.New("snapshot: commit ended")

// Snapshot makes an image of a running or stopped sandbox: its image's
// layers plus its changes as a new layer, with the sandbox's env (without
// secrets), workdir and user as the image config, tagged tag. It returns the
// new image's digest. A snapshot of a host-image sandbox holds only the
// changes and is marked to stack on the host image again.
func (m *Manager) Snapshot(ctx context.Context, ref, tag string) (string, error) {
	b, err := m.lookup(ctx, ref)
	if err != nil {
		return "", err
	}
	committer, ok := m.cfg.Images.(ImageCommitter)
	if !ok {
		return "", fmt.Errorf("snapshot: this daemon has no image store that can commit: %w", errdefs.ErrFailedPrecondition)
	}
	b.opMu.Lock()
	defer b.opMu.Unlock()
	b.mu.Lock()
	base := b.rec.ImageDigest
	b.mu.Unlock()
	cfg := SnapshotConfig{Workdir: b.spec().Workdir, User: b.spec().User}
	if b.spec().Image == HostImage {
		// The new image is the changes alone, marked to stack on the host image
		// (whose /usr is the host's, read-only, and so never in a layer).
		base = ""
		cfg.Labels = map[string]string{OnHostLabel: HostImage}
	}
	for _, k := range slices.Sorted(maps.Keys(b.spec().Env)) {
		cfg.Env = append(cfg.Env, k+"="+b.spec().Env[k])
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := m.diffLocked(ctx, b, pw)
		pw.CloseWithError(err)
		done <- err
	}()
	digest, err := committer.Commit(ctx, base, pr, cfg, tag)
	pr.CloseWithError(errCommitEnded)
	// A diff cut short by the commit's end says only that: the commit's
	// error is the one worth reporting then.
	if derr := <-done; derr != nil && (err == nil || !errors.Is(derr, errCommitEnded)) {
		return "", fmt.Errorf("snapshot sandbox %s: %w", b.id, derr)
	}
	if err != nil {
		return "", fmt.Errorf("snapshot sandbox %s: %w", b.id, err)
	}
	m.log.Info("sandbox snapshotted", "sandbox", b.id, "image", digest, "tag", tag)
	return digest, nil
}
