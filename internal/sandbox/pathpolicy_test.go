package sandbox

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
)

func TestGuardPolicies(t *testing.T) {
	rule := &sbxv1.PermissionRule{Pattern: "*.pem", Permission: sbxv1.Permission_PERMISSION_NONE}
	extra := &sbxv1.PermissionRule{Pattern: "/gen", Type: sbxv1.PatternType_PATTERN_TYPE_DIRECTORY, Permission: sbxv1.Permission_PERMISSION_WRITE, Priority: 20}
	read, none := sbxv1.Permission_PERMISSION_READ, sbxv1.Permission_PERMISSION_NONE
	tests := []struct {
		name string
		req  *sbxv1.CreateSandboxRequest
		want []*sbxv1.PathPolicy
	}{
		{
			name: "one guard each",
			req: &sbxv1.CreateSandboxRequest{
				PathPolicies: []*sbxv1.PathPolicy{{Path: "/data", Preset: "read-only"}},
				Codebases: []*sbxv1.CodebaseMount{
					{Codebase: "plain", Path: "/plain"}, // no rules: no guard
					{Codebase: "app", Preset: "agent-safe", Rules: []*sbxv1.PermissionRule{rule}},
					{Codebase: "lib", Path: "/lib2", DefaultPermission: read},
				},
			},
			want: []*sbxv1.PathPolicy{
				{Path: "/data", Preset: "read-only"},
				{Path: "/workspace", Preset: "agent-safe", Rules: []*sbxv1.PermissionRule{rule}},
				{Path: "/lib2", DefaultPermission: read},
			},
		},
		{
			name: "rules extend a codebase's preset",
			req: &sbxv1.CreateSandboxRequest{
				PathPolicies: []*sbxv1.PathPolicy{{Path: "/workspace/", Rules: []*sbxv1.PermissionRule{extra}}},
				Codebases:    []*sbxv1.CodebaseMount{{Codebase: "app", Preset: "agent-safe", Rules: []*sbxv1.PermissionRule{rule}}},
			},
			want: []*sbxv1.PathPolicy{
				{Path: "/workspace/", Preset: "agent-safe", Rules: []*sbxv1.PermissionRule{extra, rule}},
			},
		},
		{
			name: "same preset, one default",
			req: &sbxv1.CreateSandboxRequest{
				PathPolicies: []*sbxv1.PathPolicy{{Path: "/p", Preset: "read-only"}, {Path: "/p", Preset: "read-only", DefaultPermission: none}},
			},
			want: []*sbxv1.PathPolicy{{Path: "/p", Preset: "read-only", DefaultPermission: none}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := guardPolicies(tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("guardPolicies (-want +got):\n%s", diff)
			}
			if _, err := validatePathPolicies(tt.req); err != nil {
				t.Errorf("validatePathPolicies: %v", err)
			}
		})
	}
}

func TestValidatePathPolicies(t *testing.T) {
	tests := []struct {
		name string
		req  *sbxv1.CreateSandboxRequest
		want []string // in the error
	}{
		{"unknown preset", &sbxv1.CreateSandboxRequest{PathPolicies: []*sbxv1.PathPolicy{{Path: "/w", Preset: "x"}}}, []string{`unknown preset "x"`}},
		{"codebase bad rule", &sbxv1.CreateSandboxRequest{Codebases: []*sbxv1.CodebaseMount{{Codebase: "a", Rules: []*sbxv1.PermissionRule{{Pattern: "[", Permission: 1}}}}}, []string{"bad pattern"}},
		{"overlap with codebase", &sbxv1.CreateSandboxRequest{
			PathPolicies: []*sbxv1.PathPolicy{{Path: "/workspace/sub"}},
			Codebases:    []*sbxv1.CodebaseMount{{Codebase: "a", Preset: "read-only"}},
		}, []string{"overlap"}},
		{"two presets on a codebase", &sbxv1.CreateSandboxRequest{
			PathPolicies: []*sbxv1.PathPolicy{{Path: "/workspace", Preset: "development"}},
			Codebases:    []*sbxv1.CodebaseMount{{Codebase: "a", Preset: "agent-safe"}},
		}, []string{`preset "development" of path_policies[0]`, `preset "agent-safe" of codebase "a"`, "conflict"}},
		{"two codebases' presets", &sbxv1.CreateSandboxRequest{
			Codebases: []*sbxv1.CodebaseMount{{Codebase: "a", Path: "/p", Preset: "agent-safe"}, {Codebase: "b", Path: "/p", Preset: "read-only"}},
		}, []string{`codebase "a"`, `codebase "b"`}},
		{"two defaults", &sbxv1.CreateSandboxRequest{
			PathPolicies: []*sbxv1.PathPolicy{{Path: "/p", DefaultPermission: sbxv1.Permission_PERMISSION_READ}, {Path: "/p", DefaultPermission: sbxv1.Permission_PERMISSION_VIEW}},
		}, []string{"default permission PERMISSION_READ of path_policies[0]", "PERMISSION_VIEW of path_policies[1]"}},
		{"guard /dev", &sbxv1.CreateSandboxRequest{PathPolicies: []*sbxv1.PathPolicy{{Path: "/dev/shm"}}}, []string{"inside /dev"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := validatePathPolicies(tt.req)
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("got %v, want an invalid argument error", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}
