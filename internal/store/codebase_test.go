package store

import (
	"context"
	"database/sql"
	"path/filepath"
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
		got, err := s.GetCodebase(ctx, "", ref)
		if err != nil || got.ID != "cb-1" || string(got.Skipped) != "[]" {
			t.Errorf("GetCodebase(%q) = %+v, %v", ref, got, err)
		}
	}
	if _, err := s.GetCodebase(ctx, "", "nope"); !errdefs.IsNotFound(err) {
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
	if got, _ := s.GetCodebase(ctx, "", "cb-1"); got.Revision != 3 || got.FileCount != 3 {
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

func TestCodebasesPerTenant(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, r := range []*CodebaseRecord{
		{ID: "cb-a", Name: "proj", Revision: 1, SizeBytes: 10, Tenant: "acme"},
		{ID: "cb-b", Name: "proj", Revision: 1, SizeBytes: 7, Tenant: "beta"},
		{ID: "cb-o", Name: "proj", Revision: 1, SizeBytes: 1},
	} {
		if err := s.InsertCodebase(ctx, r); err != nil {
			t.Fatalf("insert %s (names are per tenant): %v", r.ID, err)
		}
	}
	if err := s.InsertCodebase(ctx, &CodebaseRecord{ID: "cb-a2", Name: "proj", Revision: 1, Tenant: "acme"}); !errdefs.IsAlreadyExists(err) {
		t.Errorf("a second proj of acme: got %v, want already exists", err)
	}
	for _, tc := range []struct{ tenant, ref, want string }{
		{"acme", "proj", "cb-a"}, {"beta", "proj", "cb-b"}, {"", "proj", "cb-o"},
		{"acme", "cb-a", "cb-a"}, {"beta", "cb-a", ""}, {"", "cb-a", ""}, {"acme", "cb-o", ""},
	} {
		got, err := s.GetCodebase(ctx, tc.tenant, tc.ref)
		switch {
		case tc.want == "" && !errdefs.IsNotFound(err):
			t.Errorf("GetCodebase(%q, %q): got %+v, %v; want not found", tc.tenant, tc.ref, got, err)
		case tc.want != "" && (err != nil || got.ID != tc.want || got.Tenant != tc.tenant):
			t.Errorf("GetCodebase(%q, %q): got %+v, %v; want %s", tc.tenant, tc.ref, got, err, tc.want)
		}
	}
	if recs, err := s.TenantCodebases(ctx, "beta"); err != nil || len(recs) != 1 || recs[0].ID != "cb-b" {
		t.Errorf("TenantCodebases(beta): got %v, %v; want cb-b only", recs, err)
	}
	if n, err := s.CodebaseBytes(ctx, "acme"); err != nil || n != 10 {
		t.Errorf("CodebaseBytes(acme): got %d, %v; want 10", n, err)
	}
	if rec, err := s.GetCodebaseByID(ctx, "cb-b"); err != nil || rec.Tenant != "beta" {
		t.Errorf("GetCodebaseByID(cb-b): got %+v, %v; want beta's", rec, err)
	}
}

func TestCodebaseTenantMigration(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "sbx.db"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE codebases (
	id TEXT PRIMARY KEY, name TEXT UNIQUE, revision INTEGER NOT NULL, file_count INTEGER NOT NULL DEFAULT 0,
	size_bytes INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, skipped TEXT NOT NULL DEFAULT '[]');
INSERT INTO codebases (id, name, revision, size_bytes, created_at, updated_at) VALUES ('cb-old', 'proj', 4, 99, 1, 2);`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := Open(ctx, dir)
	if err != nil {
		t.Fatalf("open a pre-tenant codebases table: %v", err)
	}
	defer s.Close()
	got, err := s.GetCodebase(ctx, "", "proj")
	if err != nil || got.ID != "cb-old" || got.Revision != 4 || got.SizeBytes != 99 || got.Tenant != "" {
		t.Fatalf("the old codebase after the migration: got %+v, %v; want cb-old at revision 4, the owner's", got, err)
	}
	if err := s.InsertCodebase(ctx, &CodebaseRecord{ID: "cb-new", Name: "proj", Revision: 1, Tenant: "acme"}); err != nil {
		t.Errorf("another tenant's proj after the migration: %v", err)
	}
}
