package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
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

// TestE2BEnvdTokenScope: the envdAccessToken the E2B API hands out is the
// sandbox's own secret, not the caller's API key, and opens that sandbox's
// envd and nothing else: not another sandbox of the same tenant, not
// another tenant's, not the E2B control plane, not the sbx API beyond
// envd's calls, not the sandbox's ports through the proxy. It still opens
// its sandbox after a daemon restart (derived from a key kept in the data
// directory). Before, envdAccessToken was the API key itself, so a program
// given it could drive every sandbox of the tenant.
func TestE2BEnvdTokenScope(t *testing.T) {
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
	do := func(method, path string, h map[string]string, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		return resp.StatusCode, string(b)
	}
	type created struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	create := func(key string) created {
		t.Helper()
		code, body := do(http.MethodPost, "/sandboxes", map[string]string{"X-API-Key": key, "Content-Type": "application/json"}, `{"templateID":"base","timeout":600}`)
		var c created
		if code != http.StatusCreated || json.Unmarshal([]byte(body), &c) != nil || c.SandboxID == "" {
			t.Fatalf("create: got %d %s", code, body)
		}
		t.Cleanup(func() { do(http.MethodDelete, "/sandboxes/"+c.SandboxID, map[string]string{"X-API-Key": key}, "") })
		return c
	}
	a1, a2, b1 := create(keyA), create(keyA), create(keyB)
	for _, c := range []created{a1, a2, b1} {
		if c.EnvdAccessToken == "" || c.EnvdAccessToken == keyA || c.EnvdAccessToken == keyB {
			t.Errorf("sandbox %s: envdAccessToken %q: want a secret of its own, not an API key", c.SandboxID, c.EnvdAccessToken)
		}
	}
	// envd's filesystem.Filesystem/Stat of "/" in sandbox id with token.
	stat := func(id, token string) (int, string) {
		return do(http.MethodPost, "/filesystem.Filesystem/Stat", map[string]string{
			"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "X-Access-Token": token,
			"Content-Type": "application/json", "Authorization": "Basic cm9vdDo=", // root:
		}, `{"path":"/"}`)
	}
	if code, body := stat(a1.SandboxID, a1.EnvdAccessToken); code != http.StatusOK {
		t.Fatalf("a1's token on a1's envd: got %d %s, want 200", code, body)
	}
	for _, tc := range []struct{ name, sandbox string }{
		{"another sandbox of the same tenant", a2.SandboxID},
		{"another tenant's sandbox", b1.SandboxID},
	} {
		if code, body := stat(tc.sandbox, a1.EnvdAccessToken); code != http.StatusNotFound && code != http.StatusUnauthorized {
			t.Errorf("a1's envd token on %s: got %d %s, want 404 (as for a missing sandbox) or 401", tc.name, code, body)
		}
	}
	if code, body := stat(a1.SandboxID, b1.EnvdAccessToken); code != http.StatusNotFound {
		t.Errorf("b1's envd token on acme's a1: got %d %s, want 404", code, body)
	}
	forged := a1.EnvdAccessToken[:len(a1.EnvdAccessToken)-4] + "AAAA"
	if code, body := stat(a1.SandboxID, forged); code != http.StatusUnauthorized {
		t.Errorf("a forged envd token: got %d %s, want 401", code, body)
	}
	bearer := map[string]string{"Authorization": "Bearer " + a1.EnvdAccessToken, "Content-Type": "application/json"}
	for _, tc := range []struct {
		name, method, path string
		h                  map[string]string
		body               string
		want               int
	}{
		{"E2B control plane (list)", http.MethodGet, "/sandboxes", map[string]string{"X-API-Key": a1.EnvdAccessToken}, "", http.StatusUnauthorized},
		{"E2B control plane (kill a2)", http.MethodDelete, "/sandboxes/" + a2.SandboxID, map[string]string{"X-API-Key": a1.EnvdAccessToken}, "", http.StatusUnauthorized},
		{"sbx ListSandboxes", http.MethodPost, "/sbx.v1.SandboxService/ListSandboxes", bearer, "{}", http.StatusForbidden},
		{"sbx CreateSandbox", http.MethodPost, "/sbx.v1.SandboxService/CreateSandbox", bearer, "{}", http.StatusForbidden},
		{"sbx GetSandbox of a2", http.MethodPost, "/sbx.v1.SandboxService/GetSandbox", bearer, fmt.Sprintf(`{"sandbox":%q}`, a2.SandboxID), http.StatusNotFound},
		{"sbx ImageService", http.MethodPost, "/sbx.v1.ImageService/ListImages", bearer, "{}", http.StatusForbidden},
		{"port proxy to a1", http.MethodGet, "/proxy/" + a1.SandboxID + "/8000/", map[string]string{"Authorization": "Bearer " + a1.EnvdAccessToken}, "", http.StatusUnauthorized},
		{"metrics", http.MethodGet, "/metrics", map[string]string{"Authorization": "Bearer " + a1.EnvdAccessToken}, "", http.StatusForbidden},
	} {
		if code, body := do(tc.method, tc.path, tc.h, tc.body); code != tc.want {
			t.Errorf("a1's envd token on %s: got %d %s, want %d", tc.name, code, body, tc.want)
		}
	}
	if code, _ := do(http.MethodGet, "/sandboxes/"+a2.SandboxID, map[string]string{"X-API-Key": keyA}, ""); code != http.StatusOK {
		t.Errorf("a2 after the attempts: got %d, want 200 (still there)", code)
	}

	d.stop()
	d.start()
	if code, body := stat(a1.SandboxID, a1.EnvdAccessToken); code != http.StatusOK {
		t.Errorf("a1's token after a daemon restart: got %d %s, want 200", code, body)
	}
	if code, body := stat(a2.SandboxID, a1.EnvdAccessToken); code != http.StatusNotFound {
		t.Errorf("a1's token on a2 after a daemon restart: got %d %s, want 404", code, body)
	}
}
