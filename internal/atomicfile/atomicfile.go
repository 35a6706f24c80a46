// Package atomicfile writes files that appear whole or not at all (temp file
// in the same directory, fsync, rename), and reads and writes JSON state
// files that way. It imports nothing from sbx; anything may import it.
package atomicfile

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// WriteFile atomically replaces p with data, with permissions perm.
func WriteFile(p string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(p), ".tmp-"+filepath.Base(p)+"-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	defer os.Remove(f.Name()) // no-op once renamed
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", p, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", p, err)
	}
	if err := os.Chmod(f.Name(), perm); err != nil {
		return fmt.Errorf("chmod %s: %w", p, err)
	}
	if err := os.Rename(f.Name(), p); err != nil {
		return fmt.Errorf("rename into %s: %w", p, err)
	}
	return nil
}

// WriteJSON atomically replaces p with v as indented JSON (mode 0644).
func WriteJSON(p string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", p, err)
	}
	return WriteFile(p, b, 0o644)
}

// ReadJSON decodes the JSON file p into v.
func ReadJSON(p string, v any) error {
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
