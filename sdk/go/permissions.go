package sbx

import (
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// Permission is what processes in a sandbox may do with a guarded path.
type Permission = sbxv1.Permission

// The permissions: None hides a path (ENOENT), View lists it but refuses
// opening it (EACCES), Read makes it read-only, Write allows everything.
const (
	PermNone  = sbxv1.Permission_PERMISSION_NONE
	PermView  = sbxv1.Permission_PERMISSION_VIEW
	PermRead  = sbxv1.Permission_PERMISSION_READ
	PermWrite = sbxv1.Permission_PERMISSION_WRITE
)

// PatternType says how a rule's pattern matches.
type PatternType = sbxv1.PatternType

// The pattern types: a gitignore-like glob, a directory and everything below
// it, or exactly one file.
const (
	Glob      = sbxv1.PatternType_PATTERN_TYPE_GLOB
	Directory = sbxv1.PatternType_PATTERN_TYPE_DIRECTORY
	File      = sbxv1.PatternType_PATTERN_TYPE_FILE
)

// PermissionRule is one rule of a PathPolicy; patterns are relative to the
// guarded directory ("/" is its root). The highest priority wins, then file
// over directory over glob, then the longer pattern.
type PermissionRule struct {
	Pattern    string
	Type       PatternType
	Permission Permission
	Priority   int32
	// CaseInsensitive matches the pattern regardless of case ("*.pem" also
	// matches "KEY.PEM"), as the presets' hiding rules do.
	CaseInsensitive bool
}

func (r PermissionRule) proto() *sbxv1.PermissionRule {
	return &sbxv1.PermissionRule{Pattern: r.Pattern, Type: r.Type, Permission: r.Permission, Priority: r.Priority,
		CaseInsensitive: r.CaseInsensitive}
}

// PathPolicy guards a directory of the sandbox: every process in it, and the
// file API, sees the directory through these rules.
type PathPolicy struct {
	// Path is the absolute directory to guard, e.g. "/workspace".
	Path string
	// Preset is "view-only", "read-only", "agent-safe", "development",
	// "full-access" or "" (Rules extend or override it).
	Preset string
	Rules  []PermissionRule
	// Default is the permission of paths no rule matches (0: the preset's,
	// without a preset PermWrite).
	Default Permission
}

// Proto converts the policy to its API message.
func (p PathPolicy) Proto() *sbxv1.PathPolicy {
	out := &sbxv1.PathPolicy{Path: p.Path, Preset: p.Preset, DefaultPermission: p.Default}
	for _, r := range p.Rules {
		out.Rules = append(out.Rules, r.proto())
	}
	return out
}
