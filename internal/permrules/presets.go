package permrules

import (
	"slices"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// preset is a default permission plus rules; a policy's own rules extend it.
type preset struct {
	def   Perm
	rules []*sbxv1.PermissionRule
}

// hidePriority is the priority of the presets' hiding rules: above their
// other rules, so /output/x.key stays hidden under agent-safe. A user rule
// with a higher priority can still expose such a path.
const hidePriority = 100

// secretRules hide the usual secrets at any depth.
func secretRules() []*sbxv1.PermissionRule {
	hide := func(pat string, typ sbxv1.PatternType) *sbxv1.PermissionRule {
		return &sbxv1.PermissionRule{Pattern: pat, Type: typ, Permission: sbxv1.Permission_PERMISSION_NONE, Priority: hidePriority}
	}
	g, d := sbxv1.PatternType_PATTERN_TYPE_GLOB, sbxv1.PatternType_PATTERN_TYPE_DIRECTORY
	return []*sbxv1.PermissionRule{
		hide(".env*", g), hide("secrets", d), hide("*.key", g), hide("*.pem", g), hide("credentials*", g),
	}
}

var presets = map[string]preset{
	// Browse names and metadata, read nothing.
	"view-only": {def: View},
	// Read everything, change nothing.
	"read-only": {def: Read},
	// Read everything but secrets and .git, write only /output and /tmp.
	"agent-safe": {def: Read, rules: append(secretRules(),
		&sbxv1.PermissionRule{Pattern: ".git", Type: sbxv1.PatternType_PATTERN_TYPE_DIRECTORY, Permission: sbxv1.Permission_PERMISSION_NONE, Priority: hidePriority},
		&sbxv1.PermissionRule{Pattern: "/output", Type: sbxv1.PatternType_PATTERN_TYPE_DIRECTORY, Permission: sbxv1.Permission_PERMISSION_WRITE, Priority: 10},
		&sbxv1.PermissionRule{Pattern: "/tmp", Type: sbxv1.PatternType_PATTERN_TYPE_DIRECTORY, Permission: sbxv1.Permission_PERMISSION_WRITE, Priority: 10},
	)},
	// Read and write everything (.git included: commits work) but secrets,
	// which stay hidden.
	"development": {def: Write, rules: secretRules()},
	// No restriction (useful as a base for a few rules).
	"full-access": {def: Write},
}

// PresetNames lists the presets, sorted.
func PresetNames() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
