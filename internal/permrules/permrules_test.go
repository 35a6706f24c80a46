package permrules

import (
	"errors"
	"strings"
	"testing"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

const (
	glob = sbxv1.PatternType_PATTERN_TYPE_GLOB
	dir  = sbxv1.PatternType_PATTERN_TYPE_DIRECTORY
	file = sbxv1.PatternType_PATTERN_TYPE_FILE
)

func r(pat string, typ sbxv1.PatternType, perm Perm, prio int32) *sbxv1.PermissionRule {
	return &sbxv1.PermissionRule{Pattern: pat, Type: typ, Permission: sbxv1.Permission(perm), Priority: prio}
}

func mustCompile(t *testing.T, p *sbxv1.PathPolicy) *Policy {
	t.Helper()
	c, err := Compile(p)
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return c
}

func TestDecide(t *testing.T) {
	tests := []struct {
		name  string
		pol   *sbxv1.PathPolicy
		path  string
		isDir bool
		want  Perm
	}{
		{"no rules: write", &sbxv1.PathPolicy{Path: "/w"}, "/a", false, Write},
		{"default", &sbxv1.PathPolicy{Path: "/w", DefaultPermission: sbxv1.Permission_PERMISSION_READ}, "/a/b", false, Read},
		{"glob basename any depth", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("*.key", glob, None, 0)}}, "/a/b/x.key", false, None},
		{"glob basename no match", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("*.key", glob, None, 0)}}, "/a/b/x.keys", false, Write},
		{"glob anchored", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("src/*.go", glob, Read, 0)}}, "/src/a.go", false, Read},
		{"glob anchored not deeper dir", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("src/*.go", glob, Read, 0)}}, "/x/src/a.go", false, Write},
		{"glob doublestar", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("/out/**", glob, Read, 0)}}, "/out/a/b/c", false, Read},
		{"glob doublestar not the dir itself", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("/out/**/x", glob, Read, 0)}}, "/out", true, Write},
		{"glob doublestar zero comps", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("**/x", glob, Read, 0)}}, "/x", false, Read},
		{"dir inherits", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("/output", dir, Read, 0)}}, "/output/a/b", false, Read},
		{"dir no prefix confusion", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("/output", dir, Read, 0)}}, "/output2/a", false, Write},
		{"dir unanchored any depth", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("secrets", dir, None, 0)}}, "/a/secrets/k", false, None},
		{"file exact", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("config/prod.yaml", file, View, 0)}}, "/config/prod.yaml", false, View},
		{"file no inheritance", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("/config", file, View, 0)}}, "/config/x", false, Write},
		{"priority wins over type", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("/a/b", file, Write, 0), r("*", glob, Read, 1)}}, "/a/b", false, Read},
		{"file over dir at equal priority", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("/a/b", file, Write, 0), r("/a", dir, Read, 0)}}, "/a/b", false, Write},
		{"dir over glob at equal priority", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("*.txt", glob, Read, 0), r("/a", dir, View, 0)}}, "/a/x.txt", false, View},
		{"longer pattern at equal type", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("/src", dir, Read, 0), r("/src/gen", dir, Write, 0)}}, "/src/gen/x", false, Write},
		{"write inside read dir", &sbxv1.PathPolicy{Path: "/w", DefaultPermission: sbxv1.Permission_PERMISSION_READ, Rules: []*sbxv1.PermissionRule{r("/src/out", dir, Write, 0)}}, "/src/out/x", false, Write},
		{"hidden dir hides equal priority file rule", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("secrets", dir, None, 5), r("/secrets/pub", file, Read, 5)}}, "/secrets/pub", false, None},
		{"higher priority exposes in hidden dir", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("secrets", dir, None, 5), r("/secrets/pub", file, Read, 6)}}, "/secrets/pub", false, Read},
		{"hidden dir with exposed child is view", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("secrets", dir, None, 5), r("/secrets/pub", file, Read, 6)}}, "/secrets", true, View},
		{"hidden dir without exposed child", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("secrets", dir, None, 5), r("/other/pub", file, Read, 6)}}, "/secrets", true, None},
		{"sibling of exposed stays hidden", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("secrets", dir, None, 5), r("/secrets/pub", file, Read, 6)}}, "/secrets/priv", false, None},
		{"hidden file not promoted", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("*.key", glob, None, 5), r("*.md", glob, Read, 6)}}, "/a.key", false, None},
		{"root never below view", &sbxv1.PathPolicy{Path: "/w", DefaultPermission: sbxv1.Permission_PERMISSION_NONE}, "/", true, View},
		{"default none, rule exposes", &sbxv1.PathPolicy{Path: "/w", DefaultPermission: sbxv1.Permission_PERMISSION_NONE, Rules: []*sbxv1.PermissionRule{r("/src", dir, Read, 0)}}, "/src/a", false, Read},
		{"user rule replaces preset rule", &sbxv1.PathPolicy{Path: "/w", Preset: "agent-safe", Rules: []*sbxv1.PermissionRule{r("*.pem", glob, Read, 0)}}, "/cert.pem", false, Read},
		{"later rule wins a full tie", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("/a", dir, Read, 0), r("/a", dir, View, 0)}}, "/a/x", false, View},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustCompile(t, tt.pol)
			if got := p.Decide(tt.path, tt.isDir); got != tt.want {
				t.Errorf("Decide(%q) = %v, want %v", tt.path, got, tt.want)
			}
		})
	}
}

func TestPresets(t *testing.T) {
	tests := []struct {
		preset string
		path   string
		isDir  bool
		want   Perm
	}{
		{"view-only", "/src/a.go", false, View},
		{"view-only", "/src", true, View},
		{"read-only", "/src/a.go", false, Read},
		{"agent-safe", "/src/a.go", false, Read},
		{"agent-safe", "/output/x", false, Write},
		{"agent-safe", "/tmp/x", false, Write},
		{"agent-safe", "/output/x.key", false, None},
		{"agent-safe", "/.env", false, None},
		{"agent-safe", "/sub/.env.local", false, None},
		{"agent-safe", "/secrets/x", false, None},
		{"agent-safe", "/a/secrets", true, None},
		{"agent-safe", "/a.pem", false, None},
		{"agent-safe", "/credentials.json", false, None},
		{"agent-safe", "/.git/config", false, None},
		{"agent-safe", "/.gitignore", false, Read},
		{"development", "/src/a.go", false, Write},
		{"development", "/.git/config", false, Write},
		{"development", "/.env", false, None},
		{"development", "/secrets/x", false, None},
		{"full-access", "/.env", false, Write},
	}
	for _, tt := range tests {
		t.Run(tt.preset+tt.path, func(t *testing.T) {
			p := mustCompile(t, &sbxv1.PathPolicy{Path: "/workspace", Preset: tt.preset})
			if got := p.Decide(tt.path, tt.isDir); got != tt.want {
				t.Errorf("%s: Decide(%q) = %v, want %v", tt.preset, tt.path, got, tt.want)
			}
		})
	}
}

func TestCompileErrors(t *testing.T) {
	tests := []struct {
		name string
		pol  *sbxv1.PathPolicy
		want string
	}{
		{"relative", &sbxv1.PathPolicy{Path: "workspace"}, "relative"},
		{"empty path", &sbxv1.PathPolicy{}, "empty"},
		{"root", &sbxv1.PathPolicy{Path: "/"}, "cannot guard /"},
		{"proc", &sbxv1.PathPolicy{Path: "/proc/self"}, "inside /proc"},
		{"sys", &sbxv1.PathPolicy{Path: "/sys"}, "inside /sys"},
		{"dev", &sbxv1.PathPolicy{Path: "/dev/"}, "inside /dev"},
		{"sbx", &sbxv1.PathPolicy{Path: "/.sbx"}, "inside /.sbx"},
		{"dotdot", &sbxv1.PathPolicy{Path: "/w/../proc"}, "\"..\""},
		{"unknown preset", &sbxv1.PathPolicy{Path: "/w", Preset: "yolo"}, "unknown preset \"yolo\""},
		{"unknown default", &sbxv1.PathPolicy{Path: "/w", DefaultPermission: 9}, "unknown default permission"},
		{"missing permission", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{{Pattern: "x"}}}, "permission is required"},
		{"unknown permission", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{{Pattern: "x", Permission: 7}}}, "unknown permission 7"},
		{"unknown type", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{{Pattern: "x", Type: 9, Permission: 1}}}, "unknown pattern type"},
		{"bad glob", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("[a", glob, None, 0)}}, "bad pattern"},
		{"empty pattern", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("", glob, None, 0)}}, "empty pattern"},
		{"dotdot pattern", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("a/../b", glob, None, 0)}}, "\"..\" component"},
		{"double slash", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("a//b", glob, None, 0)}}, "empty component"},
		{"partial doublestar", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("a**", glob, None, 0)}}, "whole path component"},
		{"doublestar in dir", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("**/x", dir, None, 0)}}, "only allowed in glob"},
		{"root glob", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("/", glob, None, 0)}}, "names the root"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Compile(tt.pol)
			if err == nil {
				t.Fatalf("Compile succeeded, want an error containing %q", tt.want)
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got error %q, want ErrInvalid containing %q", err, tt.want)
			}
		})
	}
}

func TestCheckPoliciesOverlap(t *testing.T) {
	_, err := CheckPolicies([]*sbxv1.PathPolicy{{Path: "/w"}, {Path: "/w/sub"}})
	if err == nil || !strings.Contains(err.Error(), "overlap") {
		t.Errorf("got %v, want an overlap error", err)
	}
	if _, err := CheckPolicies([]*sbxv1.PathPolicy{{Path: "/w"}, {Path: "/w2"}}); err != nil {
		t.Errorf("got %v for disjoint guards, want nil", err)
	}
}
