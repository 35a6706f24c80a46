//go:build linux

package oci

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/sbxdev/sbx/internal/hostimage"
)

// NSHelperName is the small binary that makes a box's user namespace
// (cmd/sbx-userns-helper). The driver runs it from beside the agent binary
// when it is there; otherwise it runs the agent, which can do the same
// (idmap.HelperArg), at the cost of the agent's Go start on every create
// (~3 ms against ~1 ms on a quiet host, 6–9 ms against 2–3 ms on a busy one).
const NSHelperName = "sbx-userns-helper"

// installNSHelper copies the helper found beside agentPath into a
// content-addressed dir under dir that any uid can search and run (it
// runs as the box's root), removes the copies of other versions and
// returns its path; "" if there is none beside the agent.
func installNSHelper(agentPath, dir string) (string, error) {
	src := filepath.Join(filepath.Dir(agentPath), NSHelperName)
	f, err := os.Open(src)
	if os.IsNotExist(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("install %s: %w", NSHelperName, err)
	}
	h := sha256.New()
	_, err = io.Copy(h, f)
	f.Close()
	if err != nil {
		return "", fmt.Errorf("install %s: read %s: %w", NSHelperName, src, err)
	}
	name := hex.EncodeToString(h.Sum(nil))[:24]
	path := filepath.Join(dir, name, NSHelperName)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return "", fmt.Errorf("install %s: %w", NSHelperName, err)
	}
	// The helper runs only during a create: older copies serve no box.
	if ents, err := os.ReadDir(dir); err == nil {
		for _, e := range ents {
			if e.Name() != name {
				_ = os.RemoveAll(filepath.Join(dir, e.Name()))
			}
		}
	}
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	tmp, err := os.MkdirTemp(dir, ".tmp-")
	if err != nil {
		return "", fmt.Errorf("install %s: %w", NSHelperName, err)
	}
	defer os.RemoveAll(tmp) // no-op after the rename
	if err := os.Chmod(tmp, 0o711); err != nil {
		return "", fmt.Errorf("install %s: %w", NSHelperName, err)
	}
	if err := hostimage.CopyFile(src, filepath.Join(tmp, NSHelperName), 0o755); err != nil {
		return "", fmt.Errorf("install %s: %w", NSHelperName, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return "", fmt.Errorf("install %s: %w", NSHelperName, err)
	}
	return path, nil
}
