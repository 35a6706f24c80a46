package sandbox

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
)

func TestGuardPolicies(t *testing.T) {
	rule := &sbxv1.PermissionRule{Pattern: "*.pem", Permission: sbxv1.Permission_PERMISSION_NONE}
	req := &sbxv1.CreateSandboxRequest{
		PathPolicies: []*sbxv1.PathPolicy{{Path: "/data", Preset: "read-only"}},
		Codebases: []*sbxv1.CodebaseMount{
			{Codebase: "plain", Path: "/plain"}, // no rules: no guard
			{Codebase: "app", Preset: "agent-safe", Rules: []*sbxv1.PermissionRule{rule}},
			{Codebase: "lib", Path: "/lib2", DefaultPermission: sbxv1.Permission_PERMISSION_READ},
		},
	}
	want := []*sbxv1.PathPolicy{
		{Path: "/data", Preset: "read-only"},
		{Path: "/workspace", Preset: "agent-safe", Rules: []*sbxv1.PermissionRule{rule}},
		{Path: "/lib2", DefaultPermission: sbxv1.Permission_PERMISSION_READ},
	}
	if diff := cmp.Diff(want, guardPolicies(req), protocmp.Transform()); diff != "" {
		t.Errorf("guardPolicies (-want +got):\n%s", diff)
	}
	if err := validatePathPolicies(req); err != nil {
		t.Errorf("validatePathPolicies: %v", err)
	}
}

func TestValidatePathPolicies(t *testing.T) {
	tests := []struct {
		name string
		req  *sbxv1.CreateSandboxRequest
	}{
		{"unknown preset", &sbxv1.CreateSandboxRequest{PathPolicies: []*sbxv1.PathPolicy{{Path: "/w", Preset: "x"}}}},
		{"codebase bad rule", &sbxv1.CreateSandboxRequest{Codebases: []*sbxv1.CodebaseMount{{Codebase: "a", Rules: []*sbxv1.PermissionRule{{Pattern: "[", Permission: 1}}}}}},
		{"overlap with codebase", &sbxv1.CreateSandboxRequest{
			PathPolicies: []*sbxv1.PathPolicy{{Path: "/workspace/sub"}},
			Codebases:    []*sbxv1.CodebaseMount{{Codebase: "a", Preset: "read-only"}},
		}},
		{"guard /dev", &sbxv1.CreateSandboxRequest{PathPolicies: []*sbxv1.PathPolicy{{Path: "/dev/shm"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := validatePathPolicies(tt.req); !errdefs.IsInvalidArgument(err) {
				t.Errorf("got %v, want an invalid argument error", err)
			}
		})
	}
}
