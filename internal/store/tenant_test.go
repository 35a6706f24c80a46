package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// oldSchema is the sandboxes table as daemons before tenants made it:
// names unique daemon-wide.
const oldSchema = `
CREATE TABLE sandboxes (
	id            TEXT PRIMARY KEY,
	name          TEXT UNIQUE,
	state         TEXT NOT NULL,
	spec          BLOB NOT NULL,
	handle        BLOB,
	labels        TEXT NOT NULL DEFAULT '{}',
	created_at    INTEGER NOT NULL,
	expires_at    INTEGER NOT NULL DEFAULT 0,
	last_active   INTEGER NOT NULL DEFAULT 0,
	state_detail  TEXT NOT NULL DEFAULT ''
);
INSERT INTO sandboxes (id, name, state, spec, handle, labels, created_at) VALUES
	('sb-old000000001', 'dev', 'running', '{"image":"host"}', '{"id":"x"}', '{"a":"b"}', 7);
`

func TestTenantMigrationKeepsRowsAndScopesNames(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "sbx.db"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, oldSchema); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s, err := Open(ctx, dir)
	if err != nil {
		t.Fatalf("open a pre-tenant database: %v", err)
	}
	got, err := s.Get(ctx, "sb-old000000001")
	if err != nil {
		t.Fatalf("the old row after the migration: %v", err)
	}
	if got.Name != "dev" || got.Tenant != "" || got.Labels["a"] != "b" || got.CreatedAtMs != 7 || string(got.Handle) != `{"id":"x"}` {
		t.Errorf("migrated row = %+v, want the old values with tenant \"\"", got)
	}
	rec := func(id, tenant, name string) *Record {
		return &Record{ID: id, Name: name, Tenant: tenant, State: "running", Spec: json.RawMessage(`{}`), Parent: "p-" + id, ScopedTokenHash: "sha256:" + id}
	}
	for _, r := range []*Record{rec("sb-a", "acme", "dev"), rec("sb-b", "beta", "dev")} {
		if err := s.Insert(ctx, r); err != nil {
			t.Fatalf("insert %s/%s: got %v, want success (names are per tenant)", r.Tenant, r.Name, err)
		}
	}
	if err := s.Insert(ctx, rec("sb-c", "acme", "dev")); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("second acme/dev: got %v, want ErrAlreadyExists", err)
	}
	s.Close()

	// Reopening does not migrate again and keeps the new columns.
	s, err = Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b, err := s.Get(ctx, "sb-b")
	if err != nil {
		t.Fatal(err)
	}
	if b.Tenant != "beta" || b.Parent != "p-sb-b" || b.ScopedTokenHash != "sha256:sb-b" {
		t.Errorf("reopened row = tenant %q parent %q token %q, want beta, p-sb-b, sha256:sb-b", b.Tenant, b.Parent, b.ScopedTokenHash)
	}
	all, err := s.List(ctx)
	if err != nil || len(all) != 3 {
		t.Fatalf("list after reopen: %d rows, err %v; want 3", len(all), err)
	}
}
