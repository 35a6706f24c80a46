package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// processSchema holds the daemon's long-lived processes in sandboxes: shell
// sessions and code contexts (see internal/codeexec). Each is a detached
// process in its sandbox's agent, under the same id, so that a restarted
// daemon can re-attach to it.
const processSchema = `
CREATE TABLE IF NOT EXISTS exec_processes (
	id          TEXT PRIMARY KEY,
	kind        TEXT NOT NULL,
	sandbox_id  TEXT NOT NULL,
	program     TEXT NOT NULL,
	token       BLOB NOT NULL,
	workdir     TEXT NOT NULL DEFAULT '',
	created_at  INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS exec_processes_sandbox ON exec_processes (sandbox_id);
`

// Kinds of ProcessRecord.
const (
	ProcessSession = "session"
	ProcessContext = "context"
)

// ProcessRecord is one session or context as persisted.
type ProcessRecord struct {
	// ID is the session or context id, also its detached process's id in the agent.
	ID        string
	Kind      string // ProcessSession or ProcessContext
	SandboxID string
	// Program is the shell (sessions) or the language (contexts).
	Program string
	// Token is the marker prefix of its output protocol.
	Token       []byte
	Workdir     string
	CreatedAtMs int64
	// Lease is who runs code in the process now, when replicas share the
	// records (kubestore); the SQLite store does not keep it (one daemon
	// serialises in memory).
	Lease ProcessLease `json:",omitempty"`
}

// ProcessLease serialises the use of one session or context across
// replicas: the holder attaches to the process and runs one command;
// another replica waits until it is released or expires (its holder died).
type ProcessLease struct {
	Holder  string `json:",omitempty"`
	UntilMs int64  `json:",omitempty"`
	// Last is the holder that took the lease last: a replica whose own
	// attachment predates another holder's must re-attach.
	Last string `json:",omitempty"`
}

// PutProcess inserts or replaces a process record.
func (s *Store) PutProcess(ctx context.Context, r *ProcessRecord) error {
	_, err := s.db.ExecContext(ctx,
		`INSERT OR REPLACE INTO exec_processes (id, kind, sandbox_id, program, token, workdir, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		r.ID, r.Kind, r.SandboxID, r.Program, r.Token, r.Workdir, r.CreatedAtMs)
	if err != nil {
		return fmt.Errorf("save %s %s: %w", r.Kind, r.ID, err)
	}
	return nil
}

// DeleteProcess removes a process record; a missing one is not an error.
func (s *Store) DeleteProcess(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM exec_processes WHERE id = ?`, id); err != nil {
		return fmt.Errorf("delete process record %s: %w", id, err)
	}
	return nil
}

// GetProcess returns the record of id; a missing one wraps errdefs.ErrNotFound.
func (s *Store) GetProcess(ctx context.Context, id string) (*ProcessRecord, error) {
	var r ProcessRecord
	err := s.db.QueryRowContext(ctx,
		`SELECT id, kind, sandbox_id, program, token, workdir, created_at FROM exec_processes WHERE id = ?`, id).
		Scan(&r.ID, &r.Kind, &r.SandboxID, &r.Program, &r.Token, &r.Workdir, &r.CreatedAtMs)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("process record %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get process record %s: %w", id, err)
	}
	return &r, nil
}

// ListProcesses returns the process records of one kind, oldest first.
func (s *Store) ListProcesses(ctx context.Context, kind string) ([]*ProcessRecord, error) {
	rows, err := s.db.QueryContext(ctx,
		`SELECT id, kind, sandbox_id, program, token, workdir, created_at FROM exec_processes WHERE kind = ? ORDER BY created_at, id`, kind)
	if err != nil {
		return nil, fmt.Errorf("list %s records: %w", kind, err)
	}
	defer rows.Close()
	var out []*ProcessRecord
	for rows.Next() {
		var r ProcessRecord
		if err := rows.Scan(&r.ID, &r.Kind, &r.SandboxID, &r.Program, &r.Token, &r.Workdir, &r.CreatedAtMs); err != nil {
			return nil, fmt.Errorf("scan %s record: %w", kind, err)
		}
		out = append(out, &r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read %s records: %w", kind, err)
	}
	return out, nil
}
