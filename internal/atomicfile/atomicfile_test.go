package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteAndReadJSON(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	want := map[string]int{"a": 1}
	if err := WriteJSON(p, want); err != nil {
		t.Fatal(err)
	}
	var got map[string]int
	if err := ReadJSON(p, &got); err != nil || got["a"] != 1 {
		t.Fatalf("got %v, %v; want %v", got, err, want)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("got %d files, want 1 (no temp file left)", len(ents))
	}
	if err := WriteFile(filepath.Join(dir, "missing", "x"), nil, 0o600); err == nil {
		t.Error("write into a missing directory succeeded")
	}
}
