// Package testutil holds helpers shared by sbx's tests: privilege checks and
// building the binaries tests boot. Only _test.go files may import it.
package testutil

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// RequiresRoot skips the test unless it runs as root.
func RequiresRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("requires root (run the tests as root to exercise real isolation)")
	}
}

// AgentEnv names an environment variable that, when set, points at a prebuilt
// sbx-agent used instead of building one.
const AgentEnv = "SBX_TEST_AGENT"

var agentOnce struct {
	sync.Once
	path string
	err  error
}

// AgentBinary returns the path of a static sbx-agent built from this checkout
// (CGO_ENABLED=0), built once per test binary. The file lives at a stable
// path in the temp dir named after the checkout, replaced atomically, so
// parallel test binaries of one checkout share it, nothing accumulates, and
// a second checkout (a worktree) never runs the first one's agent. The file and its directory are world-readable so
// that sandboxes with a mapped uid can execute it.
func AgentBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(AgentEnv); p != "" {
		return p
	}
	agentOnce.Do(func() { agentOnce.path, agentOnce.err = buildAgent() })
	if agentOnce.err != nil {
		t.Fatalf("build sbx-agent: %v", agentOnce.err)
	}
	return agentOnce.path
}

func buildAgent() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	if _, err := os.Stat(filepath.Join(root, "cmd", "sbx-agent")); err != nil {
		return "", fmt.Errorf("no cmd/sbx-agent in %s: %w", root, err)
	}
	sum := sha256.Sum256([]byte(root))
	dir := filepath.Join(os.TempDir(), "sbx-test-bin", hex.EncodeToString(sum[:6]))
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
		if err := os.Chmod(d, 0o755); err != nil {
			return "", err
		}
	}
	// The user namespace helper beside the agent, where the oci driver
	// looks for it (as `make build` puts it).
	for _, pkg := range []string{"sbx-userns-helper", "sbx-agent"} {
		dst := filepath.Join(dir, pkg)
		tmp := fmt.Sprintf("%s.%d", dst, os.Getpid())
		cmd := exec.Command("go", "build", "-o", tmp, "./cmd/"+pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			os.Remove(tmp)
			return "", fmt.Errorf("go build ./cmd/%s: %w\n%s", pkg, err, out)
		}
		if err := os.Rename(tmp, dst); err != nil {
			os.Remove(tmp)
			return "", err
		}
	}
	return filepath.Join(dir, "sbx-agent"), nil
}
