package sandbox

import (
	"context"
	"fmt"
	"strings"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
)

// DefaultCodebasePath is where a codebase is mounted unless a path is given.
const DefaultCodebasePath = "/workspace"

// Codebases mounts codebases into sandboxes, each with its own
// copy-on-write layer, and syncs a sandbox's changes back
// (internal/codebase implements it).
type Codebases interface {
	// Mount makes sandboxID's layer over a codebase and returns the mount
	// to make at cm.Path; diskBytes bounds the layer.
	Mount(ctx context.Context, sandboxID string, cm *sbxv1.CodebaseMount, diskBytes int64) (runtime.Mount, error)
	// Unmount undoes every codebase mount of a sandbox.
	Unmount(ctx context.Context, sandboxID string) error
	// Sync writes a sandbox's changes under the mount at path ("" = its only
	// one) back; the sandbox must be frozen or stopped.
	Sync(ctx context.Context, sandboxID, path string, dryRun, force bool) (*sbxv1.SyncCodebaseResponse, error)
	// MountPaths lists a sandbox's codebase mount paths.
	MountPaths(ctx context.Context, sandboxID string) ([]string, error)
	// Cleanup undoes the mounts of sandboxes not in keep.
	Cleanup(ctx context.Context, keep map[string]bool) error
}

// validateCodebases fills default mount paths and checks them against
// each other and the volume mounts.
func validateCodebases(spec *sbxv1.CreateSandboxRequest) error {
	seen := map[string]bool{}
	for _, vm := range spec.GetVolumes() {
		seen[vm.GetPath()] = true
	}
	for _, cm := range spec.GetCodebases() {
		if cm.GetCodebase() == "" {
			return invalid("codebase mount at %q: no codebase named", cm.GetPath())
		}
		if cm.Path == "" {
			cm.Path = DefaultCodebasePath
		}
		if err := runtime.ValidateMountPath(cm.GetPath()); err != nil {
			return invalid("codebase %q: %v", cm.GetCodebase(), err)
		}
		if seen[cm.GetPath()] {
			return invalid("codebase mount path %q: used twice", cm.GetPath())
		}
		seen[cm.GetPath()] = true
	}
	return nil
}

// mountCodebases makes the layers of a new box's codebases. The caller
// undoes them (unmountCodebases) if anything later fails.
func (m *Manager) mountCodebases(ctx context.Context, id string, spec *sbxv1.CreateSandboxRequest) ([]runtime.Mount, error) {
	if len(spec.GetCodebases()) == 0 {
		return nil, nil
	}
	if m.cfg.Codebases == nil {
		return nil, fmt.Errorf("codebases: not supported by this daemon: %w", errdefs.ErrFailedPrecondition)
	}
	out := make([]runtime.Mount, 0, len(spec.GetCodebases()))
	for _, cm := range spec.GetCodebases() {
		mnt, err := m.cfg.Codebases.Mount(ctx, id, cm, spec.GetResources().GetDiskBytes())
		if err != nil {
			return nil, err
		}
		mnt.Destination = cm.GetPath()
		out = append(out, mnt)
	}
	return out, nil
}

// unmountCodebases undoes a box's codebase mounts (errors are logged: the
// next Recover's Cleanup retries).
func (m *Manager) unmountCodebases(ctx context.Context, id string) {
	if m.cfg.Codebases == nil {
		return
	}
	if err := m.cfg.Codebases.Unmount(ctx, id); err != nil {
		m.log.Error("unmounting codebases", "sandbox", id, "err", err)
	}
}

// SyncCodebase writes a sandbox's changes under one codebase mount back
// into the codebase. A running sandbox is frozen while its layer is read.
func (m *Manager) SyncCodebase(ctx context.Context, ref, path string, dryRun, force bool) (*sbxv1.SyncCodebaseResponse, error) {
	b, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	if m.cfg.Codebases == nil {
		return nil, fmt.Errorf("codebases: not supported by this daemon: %w", errdefs.ErrFailedPrecondition)
	}
	b.opMu.Lock()
	defer b.opMu.Unlock()
	thaw, err := m.freezeLocked(ctx, b)
	if err != nil {
		return nil, err
	}
	defer thaw()
	return m.cfg.Codebases.Sync(ctx, b.id, path, dryRun, force)
}

// freezeLocked pauses a running box for a consistent read of its layers;
// thaw resumes it (a stopped box stays stopped). b.opMu must be held.
func (m *Manager) freezeLocked(ctx context.Context, b *box) (thaw func(), err error) {
	b.mu.Lock()
	st, h := stateOf(b.rec.State), b.handle
	b.mu.Unlock()
	switch st {
	case sbxv1.SandboxState_SANDBOX_STATE_STOPPED:
		return func() {}, nil
	case sbxv1.SandboxState_SANDBOX_STATE_RUNNING:
	default:
		return nil, b.notRunning(st)
	}
	if err := b.require(ctx, runtime.CapPause, "freezing a running sandbox to read its files"); err != nil {
		return nil, err
	}
	if err := b.driver.Pause(ctx, h); err != nil {
		return nil, fmt.Errorf("freeze sandbox %s: %w", b.id, err)
	}
	return func() {
		if err := b.driver.Resume(context.WithoutCancel(ctx), h); err != nil {
			m.log.Error("thawing sandbox after codebase sync", "sandbox", b.id, "err", err)
		}
	}, nil
}

// DestroySynced syncs every codebase mount of a sandbox back (without
// force) and then destroys it. A conflict refuses the destroy.
func (m *Manager) DestroySynced(ctx context.Context, ref string) error {
	b, err := m.lookup(ctx, ref)
	if err != nil {
		return err
	}
	b.opMu.Lock()
	defer b.opMu.Unlock()
	if m.cfg.Codebases != nil && len(b.spec().GetCodebases()) > 0 {
		thaw, err := m.freezeLocked(ctx, b)
		if err != nil {
			return err
		}
		paths, err := m.cfg.Codebases.MountPaths(ctx, b.id)
		if err != nil {
			thaw()
			return err
		}
		var conflicts []string
		for _, p := range paths {
			resp, err := m.cfg.Codebases.Sync(ctx, b.id, p, false, false)
			if err != nil {
				thaw()
				return fmt.Errorf("sync codebase at %s before destroy: %w", p, err)
			}
			for _, c := range resp.GetConflicts() {
				conflicts = append(conflicts, fmt.Sprintf("%s: %s (%s)", p, c.GetPath(), c.GetReason()))
			}
		}
		if len(conflicts) > 0 {
			thaw()
			return fmt.Errorf("sandbox %s not destroyed: codebase sync conflicts: %s (sync with force, then destroy): %w",
				b.id, strings.Join(conflicts, "; "), errdefs.ErrFailedPrecondition)
		}
		// Destroyed while frozen: the processes never see the sync.
	}
	return m.destroyLocked(ctx, b, "destroyed")
}
