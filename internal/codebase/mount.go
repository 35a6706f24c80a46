package codebase

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/store"
)

// mountDir is the host directory of one mount of a sandbox.
func (m *Manager) mountDir(sandboxID, path string) string {
	sum := sha256.Sum256([]byte(path))
	return filepath.Join(m.mountsDir(), sandboxID, hex.EncodeToString(sum[:6]))
}

// Mount gives sandboxID its own copy-on-write layer over a codebase's
// current revision and returns the mount for the box's driver to make at
// cm.Path (an overlay of the revision's tree under the layer). diskBytes bounds the layer (a tmpfs). The mount is recorded
// before it is made, so Cleanup finds it after a crash; a failure undoes
// everything.
func (m *Manager) Mount(ctx context.Context, sandboxID string, cm *sbxv1.CodebaseMount, diskBytes int64) (runtime.Mount, error) {
	path := cm.GetPath()
	if path == "" {
		path = DefaultMountPath
	}
	if sandboxID == "" || filepath.Base(sandboxID) != sandboxID || sandboxID == "." || sandboxID == ".." {
		return runtime.Mount{}, fmt.Errorf("sandbox id %q: not usable as a directory name: %w", sandboxID, errdefs.ErrInvalidArgument)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// The creating request's tenant's codebase: another's is not found.
	rec, err := m.cfg.Store.GetCodebase(ctx, owner(ctx), cm.GetCodebase())
	if err != nil {
		return runtime.Mount{}, err
	}
	dir := m.mountDir(sandboxID, path)
	mr := &store.CodebaseMountRecord{SandboxID: sandboxID, Path: path, CodebaseID: rec.ID, LowerRev: rec.Revision, Dir: dir}
	if err := m.cfg.Store.InsertCodebaseMount(ctx, mr); err != nil {
		return runtime.Mount{}, err
	}
	ov, err := mountLayer(m.tree(rec.ID, rec.Revision), dir, diskBytes, int(m.cfg.UIDShift))
	if err != nil {
		if derr := m.cfg.Store.DeleteCodebaseMount(context.WithoutCancel(ctx), sandboxID, path); derr != nil {
			m.log.Error("forgetting failed codebase mount", "sandbox", sandboxID, "err", derr)
		}
		return runtime.Mount{}, fmt.Errorf("mount codebase %s at %s: %w", cm.GetCodebase(), path, err)
	}
	m.log.Info("codebase mounted", "codebase", rec.ID, "revision", rec.Revision, "sandbox", sandboxID, "path", path)
	ov.Name = cm.GetCodebase()
	return runtime.Mount{Destination: path, Codebase: ov}, nil
}

// Unmount undoes every codebase mount of a sandbox (its unsynced changes
// are lost) and drops revision trees no longer needed.
func (m *Manager) Unmount(ctx context.Context, sandboxID string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	err := m.unmountSandboxLocked(ctx, sandboxID)
	m.gcLocked(ctx)
	return err
}

func (m *Manager) unmountSandboxLocked(ctx context.Context, sandboxID string) error {
	mounts, err := m.cfg.Store.CodebaseMounts(ctx, sandboxID)
	if err != nil {
		return err
	}
	var errs []error
	for _, mt := range mounts {
		if err := unmountLayer(mt.Dir); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := m.cfg.Store.DeleteCodebaseMount(ctx, sandboxID, mt.Path); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		dir := filepath.Join(m.mountsDir(), sandboxID)
		if err := removeUnmounted(dir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("unmount codebases of sandbox %s: %w", sandboxID, err)
	}
	return nil
}

// Cleanup undoes the mounts of every sandbox not in keep (records and
// directories left by a crash or a destroy that failed half-way) and
// removes revision trees no longer needed. Call it after recovery.
func (m *Manager) Cleanup(ctx context.Context, keep map[string]bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	mounts, err := m.cfg.Store.CodebaseMounts(ctx, "")
	if err != nil {
		return err
	}
	var errs []error
	gone := map[string]bool{}
	for _, mt := range mounts {
		if !keep[mt.SandboxID] {
			gone[mt.SandboxID] = true
		}
	}
	ents, err := os.ReadDir(m.mountsDir())
	if err != nil {
		return fmt.Errorf("read codebase mounts dir: %w", err)
	}
	for _, e := range ents {
		if !keep[e.Name()] {
			gone[e.Name()] = true
		}
	}
	for _, id := range slices.Sorted(mapsKeys(gone)) {
		m.log.Info("removing codebase mounts of a sandbox that is gone", "sandbox", id)
		if err := m.unmountSandboxLocked(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	m.gcLocked(ctx)
	return errors.Join(errs...)
}

func mapsKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// mountLookup finds a sandbox's mount at path ("" = its only one).
func (m *Manager) mountLookup(ctx context.Context, sandboxID, path string) (*store.CodebaseMountRecord, error) {
	mounts, err := m.cfg.Store.CodebaseMounts(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	if path == "" {
		switch len(mounts) {
		case 0:
			return nil, fmt.Errorf("sandbox %s mounts no codebase: %w", sandboxID, errdefs.ErrFailedPrecondition)
		case 1:
			return mounts[0], nil
		}
		var paths []string
		for _, mt := range mounts {
			paths = append(paths, mt.Path)
		}
		return nil, fmt.Errorf("sandbox %s mounts codebases at %v; name one with path: %w", sandboxID, paths, errdefs.ErrInvalidArgument)
	}
	for _, mt := range mounts {
		if mt.Path == path {
			return mt, nil
		}
	}
	return nil, fmt.Errorf("sandbox %s mounts no codebase at %s: %w", sandboxID, path, errdefs.ErrNotFound)
}

// MountPaths lists the codebase mount paths of a sandbox.
func (m *Manager) MountPaths(ctx context.Context, sandboxID string) ([]string, error) {
	mounts, err := m.cfg.Store.CodebaseMounts(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(mounts))
	for _, mt := range mounts {
		out = append(out, mt.Path)
	}
	return out, nil
}
