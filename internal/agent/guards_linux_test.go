package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sbxdev/sbx/api/gen/agent/v1"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/testutil"
)

// guardedAgent returns a test agent and a tree (.env, secrets/x, src/a.go,
// output/) that Configure may guard; guards are unmounted at the end.
func guardedAgent(t *testing.T) (*testAgent, string) {
	t.Helper()
	testutil.RequiresRoot(t)
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	a := newTestAgent(t)
	tree := filepath.Join(t.TempDir(), "tree")
	for name, body := range map[string]string{".env": "S=1", "secrets/x": "s", "src/a.go": "package a", "output/keep": ""} {
		p := filepath.Join(tree, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		a.srv.lockMu.Lock()
		defer a.srv.lockMu.Unlock()
		for _, g := range a.srv.lock.guards {
			if err := g.Unmount(); err != nil {
				t.Errorf("unmounting %s: %v", g.Path, err)
			}
		}
	})
	return a, tree
}

func TestConfigureGuards(t *testing.T) {
	a, tree := guardedAgent(t)
	seen := filepath.Join(t.TempDir(), "seen")
	err := a.configure(t, &agentv1.ConfigureRequest{
		PathPolicies: []*sbxv1.PathPolicy{{Path: tree, Preset: "agent-safe"}},
		// Runs only once the guard is up.
		Command: []string{"sh", "-c", "ls -a " + tree + " > " + seen},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := waitFile(t, seen); strings.Contains(got, ".env") || strings.Contains(got, "secrets") || !strings.Contains(got, "src") {
		t.Errorf("entrypoint listed %q, want src without .env and secrets", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = readAll(ctx, a, filepath.Join(tree, ".env"))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("ReadFile .env: got %v, want NotFound", err)
	}
	if b, err := readAll(ctx, a, filepath.Join(tree, "src/a.go")); err != nil || b != "package a" {
		t.Errorf("ReadFile src/a.go: got %q, %v", b, err)
	}
	ls, err := a.conn.ListDir(ctx, connect.NewRequest(&sbxv1.ListDirRequest{Path: tree, Recursive: true}))
	if err != nil {
		t.Fatal(err)
	}
	for _, fi := range ls.Msg.GetEntries() {
		if strings.Contains(fi.GetPath(), "secrets") || strings.Contains(fi.GetPath(), ".env") {
			t.Errorf("ListDir shows %s", fi.GetPath())
		}
	}
	res := a.run(t, &sbxv1.ExecRequest{Argv: []string{"sh", "-c", "echo x > " + tree + "/src/a.go"}})
	if res.exited.GetExitCode() == 0 || !strings.Contains(res.stderr, "Permission denied") {
		t.Errorf("writing read-only src/a.go: exit %d, stderr %q", res.exited.GetExitCode(), res.stderr)
	}
	// A process ran: no more guards.
	err = a.configure(t, &agentv1.ConfigureRequest{PathPolicies: []*sbxv1.PathPolicy{{Path: filepath.Join(t.TempDir(), "late")}}})
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("configure after a process started: got %v, want FailedPrecondition", err)
	}
}

func TestConfigureGuardsInvalid(t *testing.T) {
	a, tree := guardedAgent(t)
	for _, p := range []*sbxv1.PathPolicy{
		{Path: "rel"}, {Path: tree, Preset: "nope"}, {Path: "/proc"},
		{Path: tree, Rules: []*sbxv1.PermissionRule{{Pattern: "[", Permission: sbxv1.Permission_PERMISSION_NONE}}},
	} {
		err := a.configure(t, &agentv1.ConfigureRequest{PathPolicies: []*sbxv1.PathPolicy{p}})
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("configure with %v: got %v, want InvalidArgument", p, err)
		}
	}
	// Nothing was mounted: the tree shows .env.
	if _, err := os.Stat(filepath.Join(tree, ".env")); err != nil {
		t.Errorf("tree changed after refused configures: %v", err)
	}
}

func readAll(ctx context.Context, a *testAgent, path string) (string, error) {
	st, err := a.conn.ReadFile(ctx, connect.NewRequest(&sbxv1.ReadFileRequest{Path: path}))
	if err != nil {
		return "", err
	}
	defer st.Close()
	var b strings.Builder
	for st.Receive() {
		b.Write(st.Msg().GetData())
	}
	return b.String(), st.Err()
}
