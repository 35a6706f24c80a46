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
// (guarding the mount's path). Policies for the same path are merged into
// one (see mergePolicy), so rules extend a codebase's preset; two different
// presets or defaults for one path are an error naming both.
func guardPolicies(req *sbxv1.CreateSandboxRequest) ([]*sbxv1.PathPolicy, error) {
	out := make([]*sbxv1.PathPolicy, 0, len(req.GetPathPolicies()))
	var from []string // what each of out came from, for errors
	byPath := map[string]int{}
	add := func(p *sbxv1.PathPolicy, source string) error {
		// An invalid path is left alone, for CheckPolicies to report.
		if clean, err := permrules.CheckGuardPath(p.GetPath()); err == nil {
			if i, ok := byPath[clean]; ok {
				if err := mergePolicy(out[i], p, from[i], source); err != nil {
					return err
				}
				from[i] += " and " + source
				return nil
			}
			byPath[clean] = len(out)
		}
		out = append(out, p)
		from = append(from, source)
		return nil
	}
	for i, p := range req.GetPathPolicies() {
		if err := add(proto.Clone(p).(*sbxv1.PathPolicy), fmt.Sprintf("path_policies[%d]", i)); err != nil {
			return nil, err
		}
	}
	for _, cb := range req.GetCodebases() {
		if cb.GetPreset() == "" && len(cb.GetRules()) == 0 && cb.GetDefaultPermission() == sbxv1.Permission_PERMISSION_UNSPECIFIED {
			continue
		}
		p := cb.GetPath()
		if p == "" {
			p = defaultCodebasePath
		}
		pol := &sbxv1.PathPolicy{
			Path: p, Preset: cb.GetPreset(), DefaultPermission: cb.GetDefaultPermission(),
			Rules: cloneRules(cb.GetRules()),
		}
		if err := add(pol, fmt.Sprintf("codebase %q", cb.GetCodebase())); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// mergePolicy merges src (from srcName) into dst (from dstName), two
// policies for the same path: dst's rules, then src's; the preset and the
// default permission of whichever sets them, which both may only do if they
// agree.
func mergePolicy(dst, src *sbxv1.PathPolicy, dstName, srcName string) error {
	switch {
	case src.GetPreset() == "":
	case dst.GetPreset() == "":
		dst.Preset = src.GetPreset()
	case dst.GetPreset() != src.GetPreset():
		return fmt.Errorf("guard %s: preset %q of %s and preset %q of %s conflict (one preset per path; extend it with rules): %w",
			dst.GetPath(), dst.GetPreset(), dstName, src.GetPreset(), srcName, errdefs.ErrInvalidArgument)
	}
	switch d, s := dst.GetDefaultPermission(), src.GetDefaultPermission(); {
	case s == sbxv1.Permission_PERMISSION_UNSPECIFIED:
	case d == sbxv1.Permission_PERMISSION_UNSPECIFIED:
		dst.DefaultPermission = s
	case d != s:
		return fmt.Errorf("guard %s: default permission %s of %s and %s of %s conflict: %w",
			dst.GetPath(), d, dstName, s, srcName, errdefs.ErrInvalidArgument)
	}
	dst.Rules = append(dst.Rules, src.GetRules()...)
	return nil
}

func cloneRules(rs []*sbxv1.PermissionRule) []*sbxv1.PermissionRule {
	out := make([]*sbxv1.PermissionRule, len(rs))
	for i, r := range rs {
		out[i] = proto.Clone(r).(*sbxv1.PermissionRule)
	}
	return out
}

// validatePathPolicies checks every guard of a create request (presets,
// patterns, permissions, paths, overlaps) and returns them merged (see
// guardPolicies).
func validatePathPolicies(req *sbxv1.CreateSandboxRequest) ([]*sbxv1.PathPolicy, error) {
	ps, err := guardPolicies(req)
	if err != nil {
		return nil, fmt.Errorf("path policies: %w", err)
	}
	if _, err := permrules.CheckPolicies(ps); err != nil {
		return nil, fmt.Errorf("path policies: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	return ps, nil
}

// configuredByAgent reports whether the sandbox's agent is configured
// through Configure rather than the box's command line: to run as a user,
// after its path guards are mounted, or to start a command, which then
// fails the create with its error if it cannot start (on the agent's
// command line that error would only reach the agent's log).
func configuredByAgent(spec *sbxv1.CreateSandboxRequest) bool {
	return spec.GetUser() != "" || len(spec.GetPathPolicies()) > 0 || len(spec.GetCommand()) > 0
}
