package cli

import (
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/sbxdev/sbx/internal/permrules"
	"github.com/sbxdev/sbx/internal/sandbox"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// guardFlags are create's path permission flags.
type guardFlags struct {
	guards, rules []string
}

func (g *guardFlags) add(f *pflag.FlagSet) {
	f.StringArrayVar(&g.guards, "guard", nil, "guard a directory with permission rules: PATH[:PRESET] (presets: "+strings.Join(permrules.PresetNames(), ", ")+"); repeatable")
	f.StringArrayVar(&g.rules, "rule", nil, "permission rule of a guard: PATH:PERMISSION:PATTERN[:TYPE[,nocase][:PRIORITY]], PERMISSION none|view|read|write, TYPE glob|directory|file (default glob), nocase matches regardless of case; a rule on a --codebase path extends that codebase's guard (from view-only when it has no preset); repeatable")
}

// policies converts the flags; a --rule whose PATH has no --guard guards it
// without a preset. A --guard or --rule on the path of one of cbs (whose
// defaults must be filled) goes into that mount's own guard instead, so
// that it extends the mount's preset; cbs is changed in place.
func (g *guardFlags) policies(cbs []sbx.CodebaseMount) ([]sbx.PathPolicy, error) {
	var out []sbx.PathPolicy
	index := map[string]int{}
	mounts := map[string]int{}
	for i, cb := range cbs {
		p := cb.Path
		if p == "" {
			p = sandbox.DefaultCodebasePath
		}
		mounts[path.Clean(p)] = i
	}
	for _, s := range g.guards {
		p, preset, _ := strings.Cut(s, ":")
		if p == "" {
			return nil, fmt.Errorf("--guard %q: want PATH[:PRESET]", s)
		}
		key := path.Clean(p)
		if _, dup := index[key]; dup {
			return nil, fmt.Errorf("--guard %q: %s is guarded twice", s, p)
		}
		index[key] = -1
		if i, ok := mounts[key]; ok {
			cb := &cbs[i]
			if preset != "" && cb.Preset != "" && preset != cb.Preset {
				return nil, fmt.Errorf("--guard %q: codebase %s at %s has preset %q already (one preset per path: extend it with --rule %s:...)", s, cb.Codebase, p, cb.Preset, p)
			}
			if preset != "" {
				cb.Preset = preset
			}
			continue
		}
		index[key] = len(out)
		out = append(out, sbx.PathPolicy{Path: p, Preset: preset})
	}
	for _, s := range g.rules {
		p, r, err := parseRule(s)
		if err != nil {
			return nil, fmt.Errorf("--rule %q: %w", s, err)
		}
		key := path.Clean(p)
		if i, ok := mounts[key]; ok {
			cbs[i].Rules = append(cbs[i].Rules, r)
			continue
		}
		i, ok := index[key]
		if !ok {
			i = len(out)
			index[key] = i
			out = append(out, sbx.PathPolicy{Path: p})
		}
		out[i].Rules = append(out[i].Rules, r)
	}
	return out, nil
}

// parseRule parses PATH:PERMISSION:PATTERN[:TYPE[,nocase][:PRIORITY]]. The
// pattern may contain ":" unless its last parts read as a type and
// priority.
func parseRule(s string) (string, sbx.PermissionRule, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 3 || parts[0] == "" || parts[2] == "" {
		return "", sbx.PermissionRule{}, fmt.Errorf("want PATH:PERMISSION:PATTERN[:TYPE[,nocase][:PRIORITY]]")
	}
	perm, err := permrules.ParsePerm(parts[1])
	if err != nil {
		return "", sbx.PermissionRule{}, err
	}
	r := sbx.PermissionRule{Permission: sbx.Permission(perm), Type: sbx.Glob}
	rest := parts[2:]
	if n := len(rest); n >= 3 {
		if prio, err := strconv.ParseInt(rest[n-1], 10, 32); err == nil {
			ok, err := parseRuleType(rest[n-2], &r)
			if err != nil {
				return "", sbx.PermissionRule{}, err
			}
			if ok {
				r.Priority, rest = int32(prio), rest[:n-2]
			}
		}
	}
	if n := len(rest); n >= 2 && r.Priority == 0 && rest[n-1] != "" {
		ok, err := parseRuleType(rest[n-1], &r)
		if err != nil {
			return "", sbx.PermissionRule{}, err
		}
		if ok {
			rest = rest[:n-1]
		}
	}
	r.Pattern = strings.Join(rest, ":")
	return parts[0], r, nil
}

// parseRuleType parses TYPE[,nocase] into r. ok is false if s is no type
// (it is then part of the pattern); a type with an unknown option is an
// error.
func parseRuleType(s string, r *sbx.PermissionRule) (ok bool, err error) {
	t, opt, hasOpt := strings.Cut(s, ",")
	typ, err := permrules.ParseType(t)
	if err != nil {
		return false, nil
	}
	if hasOpt && opt != "nocase" {
		return false, fmt.Errorf("unknown rule option %q after type %q (want nocase)", opt, t)
	}
	r.Type, r.CaseInsensitive = typ, hasOpt
	return true, nil
}
