// Package store owns sbx's persistent state: one SQLite file (pure-Go
// driver) in the daemon's data dir. It stores sandbox records verbatim and
// knows nothing about their meaning; internal/sandbox is its only user. It
// also keeps codebase metadata (codebase.go) for internal/codebase and the
// records of shell sessions and code contexts (processes.go) for
// internal/codeexec.
//
// Durability: the database runs in WAL mode with synchronous=NORMAL, so a
// committed write survives the daemon being killed at any point (kill -9);
// only a power loss may drop the last transactions.
package store

import (
	"context"
	"database/sql"
	"encoding/json"

	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/sbxdev/sbx/internal/errdefs"
	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Store is a handle on the state database. Safe for concurrent use.
type Store struct {
	db *sql.DB
}

// Record is one sandbox as persisted.
type Record struct {
	ID    string
	Name  string // "" when unnamed
	State string
	// Spec is the creation request, JSON-encoded by the caller.
	Spec json.RawMessage
	// Handle is the runtime driver's handle, JSON-encoded by the caller.
	Handle         json.RawMessage
	Labels         map[string]string
	CreatedAtMs    int64
	ExpiresAtMs    int64
	LastActiveAtMs int64
	StateDetail    string
	// ImageDigest is the digest of the image the sandbox started from ("" for host).
	ImageDigest string
	// Tenant owns the sandbox ("": the single-user owner); names are
	// unique per tenant.
	Tenant string
	// Parent is the id of the sandbox whose scoped token made this one
	// ("": made with a tenant's token).
	Parent string
	// ScopedTokenHash is the hash of the sandbox's own scoped token ("": none).
	ScopedTokenHash string

	// The fields below are kept only by shared backends (kubestore); this
	// SQLite store neither writes nor returns them.

	// Version is the backend's version of the record as read or last
	// written (the object's resourceVersion): a replica compares it to
	// tell whether another one changed the record.
	Version string `json:"-"`
	// DestroyingSinceMs is when the record was marked destroying (0: it
	// is not): a replica finishes another's teardown only once it is old.
	DestroyingSinceMs int64 `json:",omitempty"`
}

const schema = `
CREATE TABLE IF NOT EXISTS sandboxes (
	id            TEXT PRIMARY KEY,
	name          TEXT,
	state         TEXT NOT NULL,
	spec          BLOB NOT NULL,
	handle        BLOB,
	labels        TEXT NOT NULL DEFAULT '{}',
	created_at    INTEGER NOT NULL,
	expires_at    INTEGER NOT NULL DEFAULT 0,
	last_active   INTEGER NOT NULL DEFAULT 0,
	state_detail  TEXT NOT NULL DEFAULT '',
	image_digest  TEXT NOT NULL DEFAULT '',
	tenant        TEXT NOT NULL DEFAULT '',
	parent        TEXT NOT NULL DEFAULT '',
	scoped_token  TEXT NOT NULL DEFAULT '',
	UNIQUE (tenant, name)
);
`

// tenantColumns rebuilds a table made before tenants: its names were unique
// daemon-wide (a column constraint SQLite cannot drop in place), now per
// tenant. Every existing row keeps its values and belongs to the
// single-user owner "".
const tenantColumns = `
CREATE TABLE sandboxes_tenants (
	id            TEXT PRIMARY KEY,
	name          TEXT,
	state         TEXT NOT NULL,
	spec          BLOB NOT NULL,
	handle        BLOB,
	labels        TEXT NOT NULL DEFAULT '{}',
	created_at    INTEGER NOT NULL,
	expires_at    INTEGER NOT NULL DEFAULT 0,
	last_active   INTEGER NOT NULL DEFAULT 0,
	state_detail  TEXT NOT NULL DEFAULT '',
	image_digest  TEXT NOT NULL DEFAULT '',
	tenant        TEXT NOT NULL DEFAULT '',
	parent        TEXT NOT NULL DEFAULT '',
	scoped_token  TEXT NOT NULL DEFAULT '',
	UNIQUE (tenant, name)
);
INSERT INTO sandboxes_tenants (id, name, state, spec, handle, labels, created_at, expires_at, last_active, state_detail, image_digest)
	SELECT id, name, state, spec, handle, labels, created_at, expires_at, last_active, state_detail, image_digest FROM sandboxes;
DROP TABLE sandboxes;
ALTER TABLE sandboxes_tenants RENAME TO sandboxes;
`

// migrations add columns to databases made by older versions; each is
// applied when its column is missing.
var migrations = []struct{ column, ddl string }{
	{"image_digest", `ALTER TABLE sandboxes ADD COLUMN image_digest TEXT NOT NULL DEFAULT ''`},
}

func migrate(ctx context.Context, db *sql.DB) error {
	rows, err := db.QueryContext(ctx, `SELECT name FROM pragma_table_info('sandboxes')`)
	if err != nil {
		return fmt.Errorf("read schema: %w", err)
	}
	have := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return fmt.Errorf("read schema: %w", err)
		}
		have[name] = true
	}
	rows.Close()
	for _, m := range migrations {
		if !have[m.column] {
			if _, err := db.ExecContext(ctx, m.ddl); err != nil {
				return fmt.Errorf("add column %s: %w", m.column, err)
			}
		}
	}
	if !have["tenant"] {
		if err := rebuild(ctx, db, "sandboxes", tenantColumns); err != nil {
			return err
		}
	}
	cb, err := columns(ctx, db, "codebases")
	if err != nil {
		return err
	}
	if !cb["tenant"] {
		return rebuild(ctx, db, "codebases", codebaseTenantColumn)
	}
	return nil
}

// columns returns the column names of table.
func columns(ctx context.Context, db *sql.DB, table string) (map[string]bool, error) {
	rows, err := db.QueryContext(ctx, `SELECT name FROM pragma_table_info(?)`, table)
	if err != nil {
		return nil, fmt.Errorf("read schema of %s: %w", table, err)
	}
	defer rows.Close()
	have := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, fmt.Errorf("read schema of %s: %w", table, err)
		}
		have[name] = true
	}
	return have, rows.Err()
}

// rebuild runs a table rebuild (ddl) in one transaction: a daemon killed
// half-way leaves the old table.
func rebuild(ctx context.Context, db *sql.DB, table, ddl string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin tenant migration of %s: %w", table, err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	if _, err := tx.ExecContext(ctx, ddl); err != nil {
		return fmt.Errorf("add tenant column to %s: %w", table, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit tenant migration of %s: %w", table, err)
	}
	return nil
}

// Open opens (creating if needed) the database in dir.
func Open(ctx context.Context, dir string) (*Store, error) {
	path := filepath.Join(dir, "sbx.db")
	// The database holds secrets: only root may read it. SQLite gives its
	// -wal and -shm files the main file's permissions.
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create state db %s: %w", path, err)
	}
	f.Close()
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(p, 0o600); err != nil && !os.IsNotExist(err) {
			return nil, fmt.Errorf("restrict state db %s: %w", p, err)
		}
	}
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open state db %s: %w", path, err)
	}
	// One writer at a time is SQLite's model; a small pool serves readers.
	db.SetMaxOpenConns(4)
	if _, err := db.ExecContext(ctx, schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("create schema in %s: %w", path, err)
	}
	if _, err := db.ExecContext(ctx, codebaseSchema); err != nil {
		db.Close()
		return nil, fmt.Errorf("create codebase schema in %s: %w", path, err)
	}
	if _, err := db.ExecContext(ctx, processSchema); err != nil {
		db.Close()
		return nil, fmt.Errorf("create process schema in %s: %w", path, err)
	}
	if err := migrate(ctx, db); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// Insert adds a new record. A duplicate id or name wraps errdefs.ErrAlreadyExists.
func (s *Store) Insert(ctx context.Context, r *Record) error {
	labels, err := json.Marshal(r.Labels)
	if err != nil {
		return fmt.Errorf("encode labels: %w", err)
	}
	_, err = s.db.ExecContext(ctx,
		`INSERT INTO sandboxes (id, name, state, spec, handle, labels, created_at, expires_at, last_active, state_detail, image_digest, tenant, parent, scoped_token)
		 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		r.ID, nullable(r.Name), r.State, []byte(r.Spec), []byte(r.Handle), string(labels),
		r.CreatedAtMs, r.ExpiresAtMs, r.LastActiveAtMs, r.StateDetail, r.ImageDigest, r.Tenant, r.Parent, r.ScopedTokenHash)
	if err != nil {
		if strings.Contains(err.Error(), "UNIQUE constraint failed: sandboxes.tenant, sandboxes.name") {
			return fmt.Errorf("sandbox name %q is taken: %w", r.Name, errdefs.ErrAlreadyExists)
		}
		if strings.Contains(err.Error(), "UNIQUE constraint failed") {
			return fmt.Errorf("sandbox id %q exists: %w", r.ID, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("insert sandbox %s: %w", r.ID, err)
	}
	return nil
}

// Update rewrites the mutable fields of a record (state, handle, detail,
// timestamps).
func (s *Store) Update(ctx context.Context, r *Record) error {
	res, err := s.db.ExecContext(ctx,
		`UPDATE sandboxes SET state = ?, handle = ?, expires_at = ?, last_active = ?, state_detail = ? WHERE id = ?`,
		r.State, []byte(r.Handle), r.ExpiresAtMs, r.LastActiveAtMs, r.StateDetail, r.ID)
	if err != nil {
		return fmt.Errorf("update sandbox %s: %w", r.ID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("sandbox %s: %w", r.ID, errdefs.ErrNotFound)
	}
	return nil
}

// UpdateSpec records an updated sandbox (UpdateSandbox): its spec, labels
// and deadline as in r.
func (s *Store) UpdateSpec(ctx context.Context, r *Record) error {
	labels, err := json.Marshal(r.Labels)
	if err != nil {
		return fmt.Errorf("encode labels: %w", err)
	}
	res, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET spec = ?, labels = ?, expires_at = ? WHERE id = ?`,
		[]byte(r.Spec), string(labels), r.ExpiresAtMs, r.ID)
	if err != nil {
		return fmt.Errorf("update spec of sandbox %s: %w", r.ID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("sandbox %s: %w", r.ID, errdefs.ErrNotFound)
	}
	return nil
}

// MarkDestroying records that a sandbox is being destroyed: its state,
// handle and detail as in r, and its name released (NULL), so that a new
// sandbox may take the name while the old one is torn down. The next
// start's recovery finishes the teardown of a record left in this state.
func (s *Store) MarkDestroying(ctx context.Context, r *Record) error {
	res, err := s.db.ExecContext(ctx,
		`UPDATE sandboxes SET state = ?, handle = ?, state_detail = ?, name = NULL WHERE id = ?`,
		r.State, []byte(r.Handle), r.StateDetail, r.ID)
	if err != nil {
		return fmt.Errorf("mark sandbox %s destroying: %w", r.ID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("sandbox %s: %w", r.ID, errdefs.ErrNotFound)
	}
	return nil
}

// TouchMany records last-activity times in one transaction.
func (s *Store) TouchMany(ctx context.Context, lastActive map[string]int64) error {
	if len(lastActive) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	for id, ms := range lastActive {
		if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET last_active = ? WHERE id = ?`, ms, id); err != nil {
			return fmt.Errorf("touch sandbox %s: %w", id, err)
		}
	}
	return tx.Commit()
}

// Delete removes a record; deleting a missing one is not an error.
func (s *Store) Delete(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id); err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	return nil
}

// Get returns one record by id.
func (s *Store) Get(ctx context.Context, id string) (*Record, error) {
	rows, err := s.db.QueryContext(ctx, selectAll+` WHERE id = ?`, id)
	if err != nil {
		return nil, fmt.Errorf("get sandbox %s: %w", id, err)
	}
	recs, err := scan(rows)
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return recs[0], nil
}

// List returns every record, oldest first.
func (s *Store) List(ctx context.Context) ([]*Record, error) {
	rows, err := s.db.QueryContext(ctx, selectAll+` ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	return scan(rows)
}

const selectAll = `SELECT id, COALESCE(name, ''), state, spec, handle, labels, created_at, expires_at, last_active, state_detail, image_digest, tenant, parent, scoped_token FROM sandboxes`

func scan(rows *sql.Rows) ([]*Record, error) {
	defer rows.Close()
	var out []*Record
	for rows.Next() {
		var r Record
		var spec, handle []byte
		var labels string
		if err := rows.Scan(&r.ID, &r.Name, &r.State, &spec, &handle, &labels, &r.CreatedAtMs, &r.ExpiresAtMs, &r.LastActiveAtMs, &r.StateDetail, &r.ImageDigest, &r.Tenant, &r.Parent, &r.ScopedTokenHash); err != nil {
			return nil, fmt.Errorf("scan sandbox row: %w", err)
		}
		r.Spec = spec
		r.Handle = handle
		if err := json.Unmarshal([]byte(labels), &r.Labels); err != nil {
			return nil, fmt.Errorf("decode labels of %s: %w", r.ID, err)
		}
		out = append(out, &r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read sandbox rows: %w", err)
	}
	return out, nil
}
