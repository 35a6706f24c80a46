package sandbox

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/permrules"
)

// defaultCodebasePath is where a codebase is mounted when its mount names no
// path.
const defaultCodebasePath = "/workspace"

// guardPolicies returns the path policies of a create request: its own, then
// one per codebase mount that has a preset, rules or a default permission
// (guarding the mount's path).
func guardPolicies(req *sbxv1.CreateSandboxRequest) []*sbxv1.PathPolicy {
	out := make([]*sbxv1.PathPolicy, 0, len(req.GetPathPolicies()))
	for _, p := range req.GetPathPolicies() {
		out = append(out, proto.Clone(p).(*sbxv1.PathPolicy))
	}
	for _, cb := range req.GetCodebases() {
		if cb.GetPreset() == "" && len(cb.GetRules()) == 0 && cb.GetDefaultPermission() == sbxv1.Permission_PERMISSION_UNSPECIFIED {
			continue
		}
		p := cb.GetPath()
		if p == "" {
			p = defaultCodebasePath
		}
		out = append(out, &sbxv1.PathPolicy{
			Path: p, Preset: cb.GetPreset(), DefaultPermission: cb.GetDefaultPermission(),
			Rules: cloneRules(cb.GetRules()),
		})
	}
	return out
}

func cloneRules(rs []*sbxv1.PermissionRule) []*sbxv1.PermissionRule {
	out := make([]*sbxv1.PermissionRule, len(rs))
	for i, r := range rs {
		out[i] = proto.Clone(r).(*sbxv1.PermissionRule)
	}
	return out
}

// validatePathPolicies checks every guard of a create request (presets,
// patterns, permissions, paths, overlaps).
func validatePathPolicies(req *sbxv1.CreateSandboxRequest) error {
	if _, err := permrules.CheckPolicies(guardPolicies(req)); err != nil {
		return fmt.Errorf("path policies: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	return nil
}

// configuredByAgent reports whether the sandbox's command must be started
// through Configure rather than the box's command line: to run as a user,
// or after its path guards are mounted.
func configuredByAgent(spec *sbxv1.CreateSandboxRequest) bool {
	return spec.GetUser() != "" || len(spec.GetPathPolicies()) > 0
}
