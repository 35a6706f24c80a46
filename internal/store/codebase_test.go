package store

import (
	"context"
	"testing"

	"github.com/sbxdev/sbx/internal/errdefs"
)

func TestCodebaseRecords(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rec := &CodebaseRecord{ID: "cb-1", Name: "proj", Revision: 1, FileCount: 2, SizeBytes: 10, CreatedAtMs: 1, UpdatedAtMs: 1}
	if err := s.InsertCodebase(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertCodebase(ctx, &CodebaseRecord{ID: "cb-2", Name: "proj", Revision: 1}); !errdefs.IsAlreadyExists(err) {
		t.Errorf("duplicate name: got %v, want already exists", err)
	}
	for _, ref := range []string{"cb-1", "proj"} {
		got, err := s.GetCodebase(ctx, ref)
		if err != nil || got.ID != "cb-1" || string(got.Skipped) != "[]" {
			t.Errorf("GetCodebase(%q) = %+v, %v", ref, got, err)
		}
	}
	if _, err := s.GetCodebase(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Errorf("missing codebase: got %v, want not found", err)
	}
	m := &CodebaseMountRecord{SandboxID: "sb-a", Path: "/workspace", CodebaseID: "cb-1", LowerRev: 1, Dir: "/x"}
	if err := s.InsertCodebaseMount(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertCodebaseMount(ctx, m); !errdefs.IsAlreadyExists(err) {
		t.Errorf("duplicate mount: got %v, want already exists", err)
	}
	commit := &CodebaseCommit{
		CodebaseID: "cb-1", Revision: 2, FileCount: 3, SizeBytes: 12, UpdatedAtMs: 2, Changed: []string{"a", "b/c"},
		SandboxID: "sb-a", MountPath: "/workspace", Synced: map[string]SyncedPath{"a": {2, "f:1"}},
	}
	if err := s.CommitCodebase(ctx, commit); err != nil {
		t.Fatal(err)
	}
	commit.Revision, commit.Changed, commit.Synced = 3, []string{"a"}, map[string]SyncedPath{"a": {3, "f:2"}}
	if err := s.CommitCodebase(ctx, commit); err != nil {
		t.Fatal(err)
	}
	changes, err := s.CodebaseChanges(ctx, "cb-1", 1)
	if err != nil || len(changes) != 2 || changes["a"] != 3 || changes["b/c"] != 2 {
		t.Errorf("changes after 1: got %v, %v", changes, err)
	}
	if changes, _ := s.CodebaseChanges(ctx, "cb-1", 2); len(changes) != 1 {
		t.Errorf("changes after 2: got %v", changes)
	}
	synced, err := s.SyncedPaths(ctx, "sb-a", "/workspace")
	if err != nil || synced["a"] != (SyncedPath{3, "f:2"}) {
		t.Errorf("synced: got %v, %v", synced, err)
	}
	if got, _ := s.GetCodebase(ctx, "cb-1"); got.Revision != 3 || got.FileCount != 3 {
		t.Errorf("after commits: got %+v", got)
	}
	if err := s.DeleteCodebaseMount(ctx, "sb-a", "/workspace"); err != nil {
		t.Fatal(err)
	}
	if synced, _ := s.SyncedPaths(ctx, "sb-a", "/workspace"); len(synced) != 0 {
		t.Errorf("synced paths outlive their mount: %v", synced)
	}
	if err := s.DeleteCodebase(ctx, "cb-1"); err != nil {
		t.Fatal(err)
	}
	if changes, _ := s.CodebaseChanges(ctx, "cb-1", 0); len(changes) != 0 {
		t.Errorf("changes outlive their codebase: %v", changes)
	}
	// Reopening an existing database keeps working (schema is idempotent).
	s.Close()
	s2, err := Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.ListCodebases(ctx); err != nil {
		t.Errorf("list codebases after reopening: %v", err)
	}
	s2.Close()
}
