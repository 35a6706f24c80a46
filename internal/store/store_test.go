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
	// UpdateSandbox's changes: spec, labels and deadline.
	want.Spec, want.Labels, want.ExpiresAtMs = json.RawMessage(`{"image":"host","labels":{"team":"b"}}`), map[string]string{"team": "b"}, 77
	if err := s.UpdateSpec(ctx, want); err != nil {
		t.Fatal(err)
	}
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
	if err := s.UpdateSpec(ctx, want); !errdefs.IsNotFound(err) {
		t.Errorf("update spec after delete: got %v, want ErrNotFound", err)
	}
}

// A sandbox marked destroying gives up its name at once: a new sandbox may
// take it while the old record waits for its teardown.
func TestMarkDestroyingReleasesName(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	old := &Record{ID: "sb-aaaaaaaaaaaa", Name: "web", State: "running", Spec: json.RawMessage(`{}`), Tenant: "acme"}
	if err := s.Insert(ctx, old); err != nil {
		t.Fatal(err)
	}
	old.State, old.StateDetail, old.Handle = "destroying", "destroyed", json.RawMessage(`{"id":"sb-aaaaaaaaaaaa","pid":7}`)
	if err := s.MarkDestroying(ctx, old); err != nil {
		t.Fatal(err)
	}
	reuse := &Record{ID: "sb-bbbbbbbbbbbb", Name: "web", State: "creating", Spec: json.RawMessage(`{}`), Tenant: "acme"}
	if err := s.Insert(ctx, reuse); err != nil {
		t.Fatalf("insert with the name of a destroying sandbox: %v", err)
	}
	got, err := s.Get(ctx, old.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "" || got.State != "destroying" || got.StateDetail != "destroyed" || string(got.Handle) != string(old.Handle) {
		t.Errorf("marked record: got name %q state %q detail %q handle %s, want no name, destroying, destroyed, %s",
			got.Name, got.State, got.StateDetail, got.Handle, old.Handle)
	}
	if err := s.MarkDestroying(ctx, &Record{ID: "sb-cccccccccccc"}); !errdefs.IsNotFound(err) {
		t.Errorf("marking a missing record: got %v, want ErrNotFound", err)
	}
}
