package store

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sbxdev/sbx/internal/errdefs"
)

func TestStoreRoundTripAndReopen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	want := &Record{
		ID: "sb-aaaaaaaaaaaa", Name: "web", State: "running", Spec: json.RawMessage(`{"image":"host"}`),
		Handle: json.RawMessage(`{"id":"sb-aaaaaaaaaaaa"}`), Labels: map[string]string{"team": "a"},
		CreatedAtMs: 1, ExpiresAtMs: 2, LastActiveAtMs: 3, ImageDigest: "sha256:abc",
	}
	if err := s.Insert(ctx, want); err != nil {
		t.Fatal(err)
	}
	dup := *want
	dup.ID = "sb-bbbbbbbbbbbb"
	if err := s.Insert(ctx, &dup); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("insert with a taken name: got %v, want ErrAlreadyExists", err)
	}
	unnamed := *want
	unnamed.ID, unnamed.Name = "sb-cccccccccccc", ""
	unnamed2 := unnamed
	unnamed2.ID = "sb-dddddddddddd"
	if err := s.Insert(ctx, &unnamed); err != nil {
		t.Fatal(err)
	}
	if err := s.Insert(ctx, &unnamed2); err != nil {
		t.Fatalf("two unnamed sandboxes: %v", err)
	}
	want.State = "stopped"
	want.StateDetail = "idle"
	if err := s.Update(ctx, want); err != nil {
		t.Fatal(err)
	}
	if err := s.TouchMany(ctx, map[string]int64{want.ID: 99}); err != nil {
		t.Fatal(err)
	}
	want.LastActiveAtMs = 99
	s.Close()

	for _, f := range []string{"sbx.db", "sbx.db-wal"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err == nil && fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode = %v, want 0600: it holds secrets", f, fi.Mode().Perm())
		}
	}

	// A reopened store (a restarted daemon) sees the same data.
	s, err = Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Get(ctx, want.ID)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("record after reopen (-want +got):\n%s", diff)
	}
	all, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 3 {
		t.Errorf("got %d records, want 3", len(all))
	}
	if err := s.Delete(ctx, want.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, want.ID); !errdefs.IsNotFound(err) {
		t.Errorf("get after delete: got %v, want ErrNotFound", err)
	}
	if err := s.Update(ctx, want); !errdefs.IsNotFound(err) {
		t.Errorf("update after delete: got %v, want ErrNotFound", err)
	}
}
