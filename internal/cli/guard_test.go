package cli

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

func TestGuardFlags(t *testing.T) {
	g := guardFlags{
		guards: []string{"/workspace:agent-safe"},
		rules: []string{
			"/workspace:write:/output/**", "/workspace:none:secrets:directory", "/workspace:read:/a.txt:file:5",
			"/data:view:*.csv", "/data:read:a:b",
		},
	}
	got, err := g.policies()
	if err != nil {
		t.Fatal(err)
	}
	want := []sbx.PathPolicy{
		{Path: "/workspace", Preset: "agent-safe", Rules: []sbx.PermissionRule{
			{Pattern: "/output/**", Type: sbx.Glob, Permission: sbx.PermWrite},
			{Pattern: "secrets", Type: sbx.Directory, Permission: sbx.PermNone},
			{Pattern: "/a.txt", Type: sbx.File, Permission: sbx.PermRead, Priority: 5},
		}},
		{Path: "/data", Rules: []sbx.PermissionRule{
			{Pattern: "*.csv", Type: sbx.Glob, Permission: sbx.PermView},
			{Pattern: "a:b", Type: sbx.Glob, Permission: sbx.PermRead},
		}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("policies (-want +got):\n%s", diff)
	}
	for _, bad := range []string{"/w:rw:x", "/w:read", ":read:x", "/w:read:"} {
		if _, err := (&guardFlags{rules: []string{bad}}).policies(); err == nil {
			t.Errorf("--rule %q accepted", bad)
		}
	}
	if _, err := (&guardFlags{guards: []string{"/w", "/w:read-only"}}).policies(); err == nil {
		t.Error("a path guarded twice was accepted")
	}
}
