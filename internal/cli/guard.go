package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/sbxdev/sbx/internal/permrules"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// guardFlags are create's path permission flags.
type guardFlags struct {
	guards, rules []string
}

func (g *guardFlags) add(f *pflag.FlagSet) {
	f.StringArrayVar(&g.guards, "guard", nil, "guard a directory with permission rules: PATH[:PRESET] (presets: "+strings.Join(permrules.PresetNames(), ", ")+"); repeatable")
	f.StringArrayVar(&g.rules, "rule", nil, "permission rule of a guard: PATH:PERMISSION:PATTERN[:TYPE[:PRIORITY]], PERMISSION none|view|read|write, TYPE glob|directory|file (default glob); repeatable")
}

// policies converts the flags; a --rule whose PATH has no --guard guards it
// without a preset.
func (g *guardFlags) policies() ([]sbx.PathPolicy, error) {
	var out []sbx.PathPolicy
	index := map[string]int{}
	for _, s := range g.guards {
		path, preset, _ := strings.Cut(s, ":")
		if path == "" {
			return nil, fmt.Errorf("--guard %q: want PATH[:PRESET]", s)
		}
		if _, dup := index[path]; dup {
			return nil, fmt.Errorf("--guard %q: %s is guarded twice", s, path)
		}
		index[path] = len(out)
		out = append(out, sbx.PathPolicy{Path: path, Preset: preset})
	}
	for _, s := range g.rules {
		path, r, err := parseRule(s)
		if err != nil {
			return nil, fmt.Errorf("--rule %q: %w", s, err)
		}
		i, ok := index[path]
		if !ok {
			i = len(out)
			index[path] = i
			out = append(out, sbx.PathPolicy{Path: path})
		}
		out[i].Rules = append(out[i].Rules, r)
	}
	return out, nil
}

// parseRule parses PATH:PERMISSION:PATTERN[:TYPE[:PRIORITY]]. The pattern
// may contain ":" unless its last parts read as a type and priority.
func parseRule(s string) (string, sbx.PermissionRule, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 3 || parts[0] == "" || parts[2] == "" {
		return "", sbx.PermissionRule{}, fmt.Errorf("want PATH:PERMISSION:PATTERN[:TYPE[:PRIORITY]]")
	}
	perm, err := permrules.ParsePerm(parts[1])
	if err != nil {
		return "", sbx.PermissionRule{}, err
	}
	r := sbx.PermissionRule{Permission: sbx.Permission(perm), Type: sbx.Glob}
	rest := parts[2:]
	if n := len(rest); n >= 3 {
		if prio, err := strconv.ParseInt(rest[n-1], 10, 32); err == nil {
			if typ, err := permrules.ParseType(rest[n-2]); err == nil {
				r.Priority, r.Type, rest = int32(prio), typ, rest[:n-2]
			}
		}
	}
	if n := len(rest); n >= 2 && r.Priority == 0 {
		if typ, err := permrules.ParseType(rest[n-1]); err == nil && rest[n-1] != "" {
			r.Type, rest = typ, rest[:n-1]
		}
	}
	r.Pattern = strings.Join(rest, ":")
	return parts[0], r, nil
}
