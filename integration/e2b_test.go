package integration

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbxdev/sbx/internal/tenant"
)

// TestE2BSDKSession runs E2B's own unmodified npm SDKs (e2b and
// @e2b/code-interpreter, pinned in integration/e2bjs/package-lock.json)
// against a real daemon with two tenants, pointed at it only by
// E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY: create, commands.run with
// streamed output, files write/read/list/stat/mkdir/rename/remove,
// watchDir, a background command with list/connect/kill, setTimeout,
// getInfo, list by metadata, runCode with a matplotlib PNG, an error and
// a context, metrics, pause and connect (resume), kill; and the other
// tenant's key gets not-found for all of it, on the control plane and on
// envd. integration/e2bjs/session.mjs is the session; each step it passes
// prints "ok STEP".
func TestE2BSDKSession(t *testing.T) {
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Skip("npm not installed (the session runs E2B's npm SDKs)")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not installed")
	}
	if !hostHas("/usr/bin/python3", "-c", "import matplotlib") {
		t.Skip("host python3 lacks matplotlib (scripts/install-deps.sh installs python3-matplotlib)")
	}
	// The project is copied out so that node_modules never lands in the
	// source tree; npm ci installs exactly the locked versions.
	proj := t.TempDir()
	for _, f := range []string{"package.json", "package-lock.json", "session.mjs"} {
		b, err := os.ReadFile(filepath.Join("e2bjs", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proj, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	install := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--loglevel=error")
	install.Dir = proj
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("npm ci: %v\n%s", err, out)
	}

	keyA, keyB := tenant.NewToken(), tenant.NewToken()
	tenants := filepath.Join(t.TempDir(), "tenants.json")
	if err := os.WriteFile(tenants, fmt.Appendf(nil, `{"tenants": [
		{"name": "acme", "tokens": [%q], "quotas": {"max_sandboxes": 4}},
		{"name": "beta", "tokens": [%q], "quotas": {"max_sandboxes": 2}}]}`,
		tenant.HashToken(keyA), tenant.HashToken(keyB)), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemonOpts(t, daemonOpts{token: keyA}, "--tenants", tenants)
	base := "http://" + d.addr

	cmd := exec.CommandContext(ctx, node, "session.mjs")
	cmd.Dir = proj
	cmd.Env = append(os.Environ(),
		"E2B_API_URL="+base, "E2B_SANDBOX_URL="+base, "E2B_API_KEY="+keyA, "SBX_OTHER_KEY="+keyB,
		"E2B_DOMAIN=", "E2B_DEBUG=")
	out, err := cmd.CombinedOutput()
	var steps []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if s, ok := strings.CutPrefix(sc.Text(), "ok "); ok {
			steps = append(steps, s)
		}
	}
	if err != nil {
		t.Fatalf("session failed after %d steps (%v): %v\n%s", len(steps), steps, err, out)
	}
	want := []string{"commands.run streamed", "files write read list stat mkdir rename remove", "files.watchDir",
		"background command connect kill", "stdin connect", "pty", "setTimeout getInfo", "list metadata", "runCode text png error context",
		"pause connect", "tenancy", "kill"}
	for _, w := range want {
		found := false
		for _, s := range steps {
			if s == w || strings.HasPrefix(s, w) {
				found = true
			}
		}
		if !found {
			t.Errorf("step %q did not pass; passed: %v\n%s", w, steps, out)
		}
	}
	t.Logf("session:\n%s", out)
}
