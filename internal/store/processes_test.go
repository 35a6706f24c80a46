package store

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sbxdev/sbx/internal/errdefs"
)

func TestProcessRecordsSurviveReopen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	sess := &ProcessRecord{ID: "sess-1", Kind: ProcessSession, SandboxID: "sb-1", Program: "/bin/bash", Token: []byte("\x1eSBXabc:"), Workdir: "/tmp", CreatedAtMs: 1}
	kctx := &ProcessRecord{ID: "ctx-1", Kind: ProcessContext, SandboxID: "sb-1", Program: "python", Token: []byte("\x1esbx-def:"), CreatedAtMs: 2}
	gone := &ProcessRecord{ID: "sess-2", Kind: ProcessSession, SandboxID: "sb-2", Program: "/bin/sh", Token: []byte("t"), CreatedAtMs: 3}
	for _, r := range []*ProcessRecord{sess, kctx, gone} {
		if err := s.PutProcess(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteProcess(ctx, gone.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteProcess(ctx, "missing"); err != nil {
		t.Errorf("deleting a missing record: got %v, want nil", err)
	}
	s.Close()
	if s, err = Open(ctx, dir); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tt := range []struct {
		kind string
		want []*ProcessRecord
	}{
		{ProcessSession, []*ProcessRecord{sess}},
		{ProcessContext, []*ProcessRecord{kctx}},
	} {
		got, err := s.ListProcesses(ctx, tt.kind)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s records after reopen (-want +got):\n%s", tt.kind, diff)
		}
	}
	got, err := s.GetProcess(ctx, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(sess, got); diff != "" {
		t.Errorf("GetProcess (-want +got):\n%s", diff)
	}
	if _, err := s.GetProcess(ctx, gone.ID); !errdefs.IsNotFound(err) {
		t.Errorf("GetProcess of a deleted record: got %v, want ErrNotFound", err)
	}
}
