//go:build linux

package codebase

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"testing"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/testutil"
)

// TestExtractTreeNeedsTheEndMarker: an upload whose stream stops without
// the tar's end-of-archive marker (a client whose packing failed midway and
// which closed its request rather than aborting it) is refused, not taken for the whole tree; one with the marker is
// extracted.
func TestExtractTreeNeedsTheEndMarker(t *testing.T) {
	testutil.RequiresRoot(t)
	var full bytes.Buffer
	tw := tar.NewWriter(&full)
	for _, name := range []string{"a", "b"} {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: 3, Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte("abc")); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	whole := full.Bytes()
	body := len(whole) - 1024 // the entries, without the two zero blocks
	tests := []struct {
		name    string
		data    []byte
		wantErr bool
	}{
		{"with the marker", whole, false},
		{"cut after the entries", whole[:body], true},
		{"cut after one zero block", whole[:body+512], true},
		{"cut after the first entry", whole[:1024], true},
		{"empty", nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			opt := extractOpts{uid: os.Getuid(), gid: os.Getgid(), maxBytes: 1 << 20, maxEntries: 100,
				skip: func(string, int64, string) {}, log: slog.New(slog.DiscardHandler)}
			_, err := extractTree(context.Background(), bytes.NewReader(tc.data), dir, opt)
			if got := err != nil; got != tc.wantErr {
				t.Fatalf("extract: got error %v, want an error: %v", err, tc.wantErr)
			}
			if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("extract: %v, not InvalidArgument", err)
			}
		})
	}
}
