package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// ociRuntime wraps one OCI runtime binary and its private state root.
type ociRuntime struct {
	path    string // absolute path of the binary
	name    string // "runc", "crun", ...
	version string // e.g. "1.1.5+ds1"
	root    string // private --root, so our containers don't mix with others
	// hide is a mount the runtime must not see ("" = none): crun on a
	// hybrid cgroup host runs without the cgroup2 mount (crunHideUnified).
	hide string
	// orphans: `run --detach` leaves a child of the runtime's re-parented
	// to the daemon (crun), which reapOrphans reaps.
	orphans bool
}

// newOCIRuntime resolves path and asks the binary for its version.
func newOCIRuntime(path, stateDir string) (*ociRuntime, error) {
	abs, err := exec.LookPath(path)
	if err != nil {
		return nil, fmt.Errorf("find oci runtime %q: %w", path, err)
	}
	out, err := exec.Command(abs, "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --version: %w", abs, err)
	}
	name := filepath.Base(abs)
	version := "unknown"
	// "runc version 1.1.5+ds1" / "crun version 1.8.1"
	if line, _, _ := strings.Cut(string(out), "\n"); strings.Contains(line, " version ") {
		_, version, _ = strings.Cut(line, " version ")
		version = strings.TrimSpace(version)
	}
	root := filepath.Join(stateDir, "runtime", name)
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("create runtime root: %w", err)
	}
	return &ociRuntime{path: abs, name: name, version: version, root: root, orphans: name == "crun"}, nil
}

func (r *ociRuntime) String() string { return r.name + " " + r.version }

func (r *ociRuntime) command(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, r.path, append([]string{"--root", r.root}, args...)...)
}

// run runs the runtime and folds its output into the error.
func (r *ociRuntime) run(ctx context.Context, args ...string) error {
	var out bytes.Buffer
	cmd := r.command(ctx, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := runCmd(cmd, "", r.hide); err != nil {
		return fmt.Errorf("%s %s: %w: %s", r.name, args[0], err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}

// runtimeState is the part of `<runtime> state` output we use.
type runtimeState struct {
	ID     string `json:"id"`
	Pid    int    `json:"pid"`
	Status string `json:"status"` // created, running, paused, stopped
}

// state returns the runtime's view of container id; a missing container is
// errdefs.ErrNotFound.
func (r *ociRuntime) state(ctx context.Context, id string) (runtimeState, error) {
	if _, err := os.Stat(r.stateDir(id)); errors.Is(err, os.ErrNotExist) {
		return runtimeState{}, fmt.Errorf("%s state %s: %w", r.name, id, errdefs.ErrNotFound)
	}
	var stdout, stderr bytes.Buffer
	cmd := r.command(ctx, "state", id)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := runCmd(cmd, "", r.hide); err != nil {
		if strings.Contains(stderr.String(), "does not exist") {
			return runtimeState{}, fmt.Errorf("%s state %s: %w", r.name, id, errdefs.ErrNotFound)
		}
		return runtimeState{}, fmt.Errorf("%s state %s: %w: %s", r.name, id, err, bytes.TrimSpace(stderr.Bytes()))
	}
	var st runtimeState
	if err := json.Unmarshal(stdout.Bytes(), &st); err != nil {
		return runtimeState{}, fmt.Errorf("parse %s state: %w", r.name, err)
	}
	return st, nil
}

// list returns the ids of every container under our root.
func (r *ociRuntime) list(ctx context.Context) ([]string, error) {
	var out bytes.Buffer
	cmd := r.command(ctx, "list", "-q")
	cmd.Stdout = &out
	if err := runCmd(cmd, "", r.hide); err != nil {
		return nil, fmt.Errorf("%s list: %w", r.name, err)
	}
	return strings.Fields(out.String()), nil
}

// stateDir is where the runtime keeps container id's state (runc and crun
// both use <root>/<id>).
func (r *ociRuntime) stateDir(id string) string { return filepath.Join(r.root, id) }
