package sandbox

import (
	"context"
	"fmt"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
)

// Volumes resolves named volumes to host directories to bind-mount.
type Volumes interface {
	// Path returns the host directory of a volume, or an error wrapping
	// errdefs.ErrNotFound.
	Path(ctx context.Context, name string) (string, error)
}

// validateVolumes checks the mounts of a create request.
func validateVolumes(mounts []*sbxv1.VolumeMount) error {
	seen := map[string]bool{}
	for _, vm := range mounts {
		if vm.GetVolume() == "" {
			return invalid("volume mount at %q: no volume named", vm.GetPath())
		}
		if err := runtime.ValidateMountPath(vm.GetPath()); err != nil {
			return invalid("volume %q: %v", vm.GetVolume(), err)
		}
		if seen[vm.GetPath()] {
			return invalid("volume mount path %q: used twice", vm.GetPath())
		}
		seen[vm.GetPath()] = true
	}
	return nil
}

// resolveVolumes turns a request's volume mounts into runtime mounts.
func (m *Manager) resolveVolumes(ctx context.Context, spec *sbxv1.CreateSandboxRequest) ([]runtime.Mount, error) {
	if err := validateVolumes(spec.GetVolumes()); err != nil {
		return nil, err
	}
	if len(spec.GetVolumes()) == 0 {
		return nil, nil
	}
	if m.cfg.Volumes == nil {
		return nil, fmt.Errorf("volumes: not supported by this daemon: %w", errdefs.ErrFailedPrecondition)
	}
	out := make([]runtime.Mount, 0, len(spec.GetVolumes()))
	for _, vm := range spec.GetVolumes() {
		src, err := m.cfg.Volumes.Path(ctx, vm.GetVolume())
		if err != nil {
			return nil, err
		}
		out = append(out, runtime.Mount{Source: src, Destination: vm.GetPath(), ReadOnly: vm.GetReadOnly()})
	}
	return out, nil
}

// VolumeUsers returns the ids of tenant's sandboxes not yet destroyed that
// mount its volume name (each tenant has volumes of its own).
func (m *Manager) VolumeUsers(tenant, name string) []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var ids []string
	for id, b := range m.boxes {
		if b.tenant != tenant {
			continue
		}
		for _, vm := range b.spec().GetVolumes() {
			if vm.GetVolume() == name {
				ids = append(ids, id)
				break
			}
		}
	}
	return ids
}
