package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// codebaseSchema holds codebase metadata (see internal/codebase):
//   - codebases: one row per codebase and its current revision, owned by a
//     tenant ("" in single-user mode); names are unique per tenant;
//   - codebase_changes: the revision at which each path last changed (paths
//     absent never changed since the upload, revision 1);
//   - codebase_mounts: one row per codebase mounted into a sandbox, with the
//     revision its lower layer is;
//   - codebase_synced: per mount, the paths a sandbox already synced, the
//     revision it wrote them at and a fingerprint of its layer's entry then.
const codebaseSchema = `
CREATE TABLE IF NOT EXISTS codebases (
	id          TEXT PRIMARY KEY,
	name        TEXT,
	revision    INTEGER NOT NULL,
	file_count  INTEGER NOT NULL DEFAULT 0,
	size_bytes  INTEGER NOT NULL DEFAULT 0,
	created_at  INTEGER NOT NULL,
	updated_at  INTEGER NOT NULL,
	skipped     TEXT NOT NULL DEFAULT '[]',
	tenant      TEXT NOT NULL DEFAULT '',
	UNIQUE (tenant, name)
);
CREATE TABLE IF NOT EXISTS codebase_changes (
	codebase_id TEXT NOT NULL,
	path        TEXT NOT NULL,
	revision    INTEGER NOT NULL,
	PRIMARY KEY (codebase_id, path)
);
CREATE TABLE IF NOT EXISTS codebase_mounts (
	sandbox_id  TEXT NOT NULL,
	path        TEXT NOT NULL,
	codebase_id TEXT NOT NULL,
	lower_rev   INTEGER NOT NULL,
	dir         TEXT NOT NULL,
	PRIMARY KEY (sandbox_id, path)
);
CREATE TABLE IF NOT EXISTS codebase_synced (
	sandbox_id  TEXT NOT NULL,
	mount_path  TEXT NOT NULL,
	path        TEXT NOT NULL,
	revision    INTEGER NOT NULL,
	fingerprint TEXT NOT NULL,
	PRIMARY KEY (sandbox_id, mount_path, path)
);
`

// codebaseTenantColumn rebuilds a codebases table made before tenants: its
// names were unique daemon-wide (a column constraint SQLite cannot drop in
// place), now per tenant. Every existing codebase keeps its values and
// belongs to the single-user owner "".
const codebaseTenantColumn = `
CREATE TABLE codebases_tenants (
	id          TEXT PRIMARY KEY,
	name        TEXT,
	revision    INTEGER NOT NULL,
	file_count  INTEGER NOT NULL DEFAULT 0,
	size_bytes  INTEGER NOT NULL DEFAULT 0,
	created_at  INTEGER NOT NULL,
	updated_at  INTEGER NOT NULL,
	skipped     TEXT NOT NULL DEFAULT '[]',
	tenant      TEXT NOT NULL DEFAULT '',
	UNIQUE (tenant, name)
);
INSERT INTO codebases_tenants (id, name, revision, file_count, size_bytes, created_at, updated_at, skipped)
	SELECT id, name, revision, file_count, size_bytes, created_at, updated_at, skipped FROM codebases;
DROP TABLE codebases;
ALTER TABLE codebases_tenants RENAME TO codebases;
`

// CodebaseRecord is one codebase as persisted.
type CodebaseRecord struct {
	ID          string
	Name        string // "" when unnamed
	Revision    int64
	FileCount   int64
	SizeBytes   int64
	CreatedAtMs int64
	UpdatedAtMs int64
	// Skipped is the upload's skipped-file report, JSON-encoded by the caller.
	Skipped json.RawMessage
	// Tenant owns the codebase ("": the single-user owner).
	Tenant string
}

// CodebaseMountRecord is one codebase mounted into one sandbox.
type CodebaseMountRecord struct {
	SandboxID  string
	Path       string // inside the sandbox
	CodebaseID string
	LowerRev   int64
	Dir        string // host directory holding the mount's layer
}

// SyncedPath is a path a sandbox synced: the revision it was written at and
// the fingerprint of the sandbox layer's entry at that time.
type SyncedPath struct {
	Revision    int64
	Fingerprint string
}

// InsertCodebase adds a codebase. A duplicate name wraps errdefs.ErrAlreadyExists.
func (s *Store) InsertCodebase(ctx context.Context, r *CodebaseRecord) error {
	skipped := r.Skipped
	if len(skipped) == 0 {
		skipped = json.RawMessage("[]")
	}
	_, err := s.db.ExecContext(ctx,
		`INSERT INTO codebases (id, name, revision, file_count, size_bytes, created_at, updated_at, skipped, tenant) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		r.ID, nullable(r.Name), r.Revision, r.FileCount, r.SizeBytes, r.CreatedAtMs, r.UpdatedAtMs, string(skipped), r.Tenant)
	if err != nil {
		if strings.Contains(err.Error(), "UNIQUE constraint failed: codebases.tenant, codebases.name") {
			return fmt.Errorf("codebase name %q is taken: %w", r.Name, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("insert codebase %s: %w", r.ID, err)
	}
	return nil
}

const selectCodebases = `SELECT id, COALESCE(name, ''), revision, file_count, size_bytes, created_at, updated_at, skipped, tenant FROM codebases`

func scanCodebases(rows *sql.Rows) ([]*CodebaseRecord, error) {
	defer rows.Close()
	var out []*CodebaseRecord
	for rows.Next() {
		var r CodebaseRecord
		var skipped string
		if err := rows.Scan(&r.ID, &r.Name, &r.Revision, &r.FileCount, &r.SizeBytes, &r.CreatedAtMs, &r.UpdatedAtMs, &skipped, &r.Tenant); err != nil {
			return nil, fmt.Errorf("scan codebase row: %w", err)
		}
		r.Skipped = json.RawMessage(skipped)
		out = append(out, &r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read codebase rows: %w", err)
	}
	return out, nil
}

// GetCodebase returns tenant's codebase by id or name. Another tenant's
// is not found, exactly like one that does not exist.
func (s *Store) GetCodebase(ctx context.Context, tenant, ref string) (*CodebaseRecord, error) {
	return s.oneCodebase(ctx, ref, ` WHERE tenant = ? AND (id = ? OR name = ?) ORDER BY id = ? DESC LIMIT 1`, tenant, ref, ref, ref)
}

// GetCodebaseByID returns a codebase by id, whoever owns it (for the
// daemon's own work: a mount's codebase).
func (s *Store) GetCodebaseByID(ctx context.Context, id string) (*CodebaseRecord, error) {
	return s.oneCodebase(ctx, id, ` WHERE id = ?`, id)
}

// oneCodebase returns the first codebase the query's where clause finds,
// or NotFound naming ref.
func (s *Store) oneCodebase(ctx context.Context, ref, where string, args ...any) (*CodebaseRecord, error) {
	rows, err := s.db.QueryContext(ctx, selectCodebases+where, args...)
	if err != nil {
		return nil, fmt.Errorf("get codebase %s: %w", ref, err)
	}
	recs, err := scanCodebases(rows)
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("codebase %q: %w", ref, errdefs.ErrNotFound)
	}
	return recs[0], nil
}

// ListCodebases returns every tenant's codebases, oldest first.
func (s *Store) ListCodebases(ctx context.Context) ([]*CodebaseRecord, error) {
	rows, err := s.db.QueryContext(ctx, selectCodebases+` ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list codebases: %w", err)
	}
	return scanCodebases(rows)
}

// TenantCodebases returns tenant's codebases, oldest first.
func (s *Store) TenantCodebases(ctx context.Context, tenant string) ([]*CodebaseRecord, error) {
	rows, err := s.db.QueryContext(ctx, selectCodebases+` WHERE tenant = ? ORDER BY created_at, id`, tenant)
	if err != nil {
		return nil, fmt.Errorf("list codebases of tenant %q: %w", tenant, err)
	}
	return scanCodebases(rows)
}

// CodebaseBytes is what tenant's codebases hold at their current revisions.
func (s *Store) CodebaseBytes(ctx context.Context, tenant string) (int64, error) {
	var n int64
	if err := s.db.QueryRowContext(ctx, `SELECT COALESCE(SUM(size_bytes), 0) FROM codebases WHERE tenant = ?`, tenant).Scan(&n); err != nil {
		return 0, fmt.Errorf("sum codebases of tenant %q: %w", tenant, err)
	}
	return n, nil
}

// DeleteCodebase removes a codebase and its change history. Mounts must be
// gone already.
func (s *Store) DeleteCodebase(ctx context.Context, id string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	for _, q := range []string{`DELETE FROM codebases WHERE id = ?`, `DELETE FROM codebase_changes WHERE codebase_id = ?`} {
		if _, err := tx.ExecContext(ctx, q, id); err != nil {
			return fmt.Errorf("delete codebase %s: %w", id, err)
		}
	}
	return tx.Commit()
}

// CodebaseCommit is the outcome of a sync: the codebase's new revision and
// counts, the paths changed at it and what the syncing mount now holds.
type CodebaseCommit struct {
	CodebaseID  string
	Revision    int64
	FileCount   int64
	SizeBytes   int64
	UpdatedAtMs int64
	Changed     []string
	// Mount whose Synced entries are upserted.
	SandboxID, MountPath string
	Synced               map[string]SyncedPath
}

// CommitCodebase records a sync in one transaction.
func (s *Store) CommitCodebase(ctx context.Context, c *CodebaseCommit) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	res, err := tx.ExecContext(ctx, `UPDATE codebases SET revision = ?, file_count = ?, size_bytes = ?, updated_at = ? WHERE id = ?`,
		c.Revision, c.FileCount, c.SizeBytes, c.UpdatedAtMs, c.CodebaseID)
	if err != nil {
		return fmt.Errorf("update codebase %s: %w", c.CodebaseID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("codebase %s: %w", c.CodebaseID, errdefs.ErrNotFound)
	}
	for _, p := range c.Changed {
		if _, err := tx.ExecContext(ctx, `INSERT INTO codebase_changes (codebase_id, path, revision) VALUES (?, ?, ?)
			ON CONFLICT (codebase_id, path) DO UPDATE SET revision = excluded.revision`, c.CodebaseID, p, c.Revision); err != nil {
			return fmt.Errorf("record change of %s: %w", p, err)
		}
	}
	if err := upsertSynced(ctx, tx, c.SandboxID, c.MountPath, c.Synced); err != nil {
		return err
	}
	return tx.Commit()
}

// UpsertSynced records synced paths of a mount without a new revision.
func (s *Store) UpsertSynced(ctx context.Context, sandboxID, mountPath string, synced map[string]SyncedPath) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	if err := upsertSynced(ctx, tx, sandboxID, mountPath, synced); err != nil {
		return err
	}
	return tx.Commit()
}

func upsertSynced(ctx context.Context, tx *sql.Tx, sandboxID, mountPath string, synced map[string]SyncedPath) error {
	for p, sp := range synced {
		if _, err := tx.ExecContext(ctx, `INSERT INTO codebase_synced (sandbox_id, mount_path, path, revision, fingerprint) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (sandbox_id, mount_path, path) DO UPDATE SET revision = excluded.revision, fingerprint = excluded.fingerprint`,
			sandboxID, mountPath, p, sp.Revision, sp.Fingerprint); err != nil {
			return fmt.Errorf("record synced path %s: %w", p, err)
		}
	}
	return nil
}

// CodebaseChanges returns the revision of the last change of every path
// changed after revision since.
func (s *Store) CodebaseChanges(ctx context.Context, codebaseID string, since int64) (map[string]int64, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT path, revision FROM codebase_changes WHERE codebase_id = ? AND revision > ?`, codebaseID, since)
	if err != nil {
		return nil, fmt.Errorf("read changes of codebase %s: %w", codebaseID, err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var p string
		var rev int64
		if err := rows.Scan(&p, &rev); err != nil {
			return nil, fmt.Errorf("scan change row: %w", err)
		}
		out[p] = rev
	}
	return out, rows.Err()
}

// InsertCodebaseMount records a mount before it is made.
func (s *Store) InsertCodebaseMount(ctx context.Context, m *CodebaseMountRecord) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO codebase_mounts (sandbox_id, path, codebase_id, lower_rev, dir) VALUES (?, ?, ?, ?, ?)`,
		m.SandboxID, m.Path, m.CodebaseID, m.LowerRev, m.Dir)
	if err != nil {
		if strings.Contains(err.Error(), "UNIQUE constraint failed") {
			return fmt.Errorf("sandbox %s already mounts a codebase at %s: %w", m.SandboxID, m.Path, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("record codebase mount: %w", err)
	}
	return nil
}

// CodebaseMounts lists mounts, all of them or (sandboxID != "") one sandbox's.
func (s *Store) CodebaseMounts(ctx context.Context, sandboxID string) ([]*CodebaseMountRecord, error) {
	q := `SELECT sandbox_id, path, codebase_id, lower_rev, dir FROM codebase_mounts`
	var args []any
	if sandboxID != "" {
		q += ` WHERE sandbox_id = ?`
		args = append(args, sandboxID)
	}
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY sandbox_id, path`, args...)
	if err != nil {
		return nil, fmt.Errorf("list codebase mounts: %w", err)
	}
	defer rows.Close()
	var out []*CodebaseMountRecord
	for rows.Next() {
		var m CodebaseMountRecord
		if err := rows.Scan(&m.SandboxID, &m.Path, &m.CodebaseID, &m.LowerRev, &m.Dir); err != nil {
			return nil, fmt.Errorf("scan codebase mount: %w", err)
		}
		out = append(out, &m)
	}
	return out, rows.Err()
}

// DeleteCodebaseMount forgets a mount and what it synced.
func (s *Store) DeleteCodebaseMount(ctx context.Context, sandboxID, path string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	if _, err := tx.ExecContext(ctx, `DELETE FROM codebase_mounts WHERE sandbox_id = ? AND path = ?`, sandboxID, path); err != nil {
		return fmt.Errorf("delete codebase mount: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM codebase_synced WHERE sandbox_id = ? AND mount_path = ?`, sandboxID, path); err != nil {
		return fmt.Errorf("delete synced paths: %w", err)
	}
	return tx.Commit()
}

// SyncedPaths returns what a mount synced so far.
func (s *Store) SyncedPaths(ctx context.Context, sandboxID, mountPath string) (map[string]SyncedPath, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT path, revision, fingerprint FROM codebase_synced WHERE sandbox_id = ? AND mount_path = ?`, sandboxID, mountPath)
	if err != nil {
		return nil, fmt.Errorf("read synced paths: %w", err)
	}
	defer rows.Close()
	out := map[string]SyncedPath{}
	for rows.Next() {
		var p string
		var sp SyncedPath
		if err := rows.Scan(&p, &sp.Revision, &sp.Fingerprint); err != nil {
			return nil, fmt.Errorf("scan synced path: %w", err)
		}
		out[p] = sp
	}
	return out, rows.Err()
}
