package cli

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

func TestGuardFlags(t *testing.T) {
	g := guardFlags{
		guards: []string{"/workspace:agent-safe"},
		rules: []string{
			"/workspace:write:/output/**", "/workspace:none:secrets:directory", "/workspace:read:/a.txt:file:5",
			"/data:view:*.csv", "/data:read:a:b", "/data:none:*.db:glob,nocase", "/data:none:*.bak:,nocase",
			"/data:read:/Docs:directory,nocase:7",
		},
	}
	got, err := g.policies(nil)
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
			{Pattern: "*.db", Type: sbx.Glob, Permission: sbx.PermNone, CaseInsensitive: true},
			{Pattern: "*.bak", Type: sbx.Glob, Permission: sbx.PermNone, CaseInsensitive: true},
			{Pattern: "/Docs", Type: sbx.Directory, Permission: sbx.PermRead, Priority: 7, CaseInsensitive: true},
		}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("policies (-want +got):\n%s", diff)
	}
	for _, bad := range []string{"/w:rw:x", "/w:read", ":read:x", "/w:read:", "/w:read:x:glob,icase", "/w:read:x:file,nocase,x:3"} {
		if _, err := (&guardFlags{rules: []string{bad}}).policies(nil); err == nil {
			t.Errorf("--rule %q accepted", bad)
		}
	}
	if _, err := (&guardFlags{guards: []string{"/w", "/w:read-only"}}).policies(nil); err == nil {
		t.Error("a path guarded twice was accepted")
	}
}

// TestGuardFlagsCodebase: --guard and --rule on a codebase mount's path
// extend the mount's own guard (one policy per path) instead of making a
// second guard that overlaps it.
func TestGuardFlagsCodebase(t *testing.T) {
	tests := []struct {
		name          string
		guard         guardFlags
		codebases     []string
		wantPolicies  []sbx.PathPolicy
		wantCodebases []sbx.CodebaseMount
		wantErr       string
	}{
		{
			name:      "rule extends the codebase preset",
			guard:     guardFlags{rules: []string{"/p:write:/gen:directory:20", "/data:none:x"}},
			codebases: []string{"cb:/p:agent-safe"},
			wantPolicies: []sbx.PathPolicy{{Path: "/data", Rules: []sbx.PermissionRule{
				{Pattern: "x", Type: sbx.Glob, Permission: sbx.PermNone}}}},
			wantCodebases: []sbx.CodebaseMount{{Codebase: "cb", Path: "/p", Preset: "agent-safe", Rules: []sbx.PermissionRule{
				{Pattern: "/gen", Type: sbx.Directory, Permission: sbx.PermWrite, Priority: 20}}}},
		},
		{
			name:      "default path",
			guard:     guardFlags{rules: []string{"/workspace/:none:*.log"}},
			codebases: []string{"cb::development"},
			wantCodebases: []sbx.CodebaseMount{{Codebase: "cb", Preset: "development", Rules: []sbx.PermissionRule{
				{Pattern: "*.log", Type: sbx.Glob, Permission: sbx.PermNone}}}},
		},
		{
			name:          "guard gives the codebase its preset",
			guard:         guardFlags{guards: []string{"/p:read-only"}},
			codebases:     []string{"cb:/p"},
			wantCodebases: []sbx.CodebaseMount{{Codebase: "cb", Path: "/p", Preset: "read-only"}},
		},
		{
			name:          "same preset twice",
			guard:         guardFlags{guards: []string{"/p:read-only"}},
			codebases:     []string{"cb:/p:read-only"},
			wantCodebases: []sbx.CodebaseMount{{Codebase: "cb", Path: "/p", Preset: "read-only"}},
		},
		{
			name:      "two presets",
			guard:     guardFlags{guards: []string{"/p:read-only"}},
			codebases: []string{"cb:/p:agent-safe"},
			wantErr:   `codebase cb at /p has preset "agent-safe" already`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cbs, err := parseCodebaseMounts(tt.codebases)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tt.guard.policies(cbs)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "read-only") {
					t.Fatalf("got error %v, want one containing %q and naming both presets", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.wantPolicies, got); diff != "" {
				t.Errorf("policies (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantCodebases, cbs); diff != "" {
				t.Errorf("codebase mounts (-want +got):\n%s", diff)
			}
		})
	}
}
