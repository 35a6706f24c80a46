package integration

import (
	"context"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// secretFiles are common secret files (and differently cased ones) that the
// agent-safe preset must hide, relative to the guarded directory.
var secretFiles = []string{
	".ssh/id_rsa", ".ssh/config", "sub/.SSH/id_ed25519", "deploy/id_rsa", "deploy/ID_ECDSA",
	".ENV", ".env.local", "Secrets/db.txt", "config/secrets.yaml", "key.PEM", "tls/server.Key",
	".netrc", ".npmrc", "web/.npmrc", ".pypirc", ".pgpass", ".git-credentials", ".vault-token", ".htpasswd",
	".docker/config.json", ".kube/config", "ops/.kube/config", "prod.kubeconfig",
	".aws/credentials", ".config/gcloud/application_default_credentials.json", ".gnupg/pubring.kbx",
	"cert.p12", "CERT.PFX", "release.jks", "app.keystore", "AuthKey_ABC.p8",
	"terraform.tfstate", "infra/Terraform.TFSTATE", "terraform.tfstate.backup",
}

// visibleFiles sit next to them and stay readable.
var visibleFiles = []string{"README.md", "deploy/id_rsa.pub", "src/key.go", ".docker/Dockerfile", "main.tf"}

// TestAgentSafeHidesSecrets fills a volume with common secret files through
// an unguarded sandbox, mounts it guarded by agent-safe in a second one and
// checks that user code (as root and as another uid) and the daemon's file
// API find none of them, by name or by listing, while their neighbours stay
// readable.
func TestAgentSafeHidesSecrets(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	c := d.client()
	if _, err := c.CreateVolume(ctx, "secrets", 32<<20); err != nil {
		t.Fatal(err)
	}
	// On failure too: the harness destroys sandboxes but leaves volumes
	// (and their loop mounts) behind.
	t.Cleanup(func() {
		ctx := context.WithoutCancel(ctx)
		if list, err := c.List(ctx); err == nil {
			for _, sb := range list {
				_ = sb.Destroy(ctx)
			}
		}
		_ = c.RemoveVolume(ctx, "secrets")
	})
	fill, err := c.Create(ctx, sbx.CreateOptions{Volumes: []sbx.VolumeMount{{Volume: "secrets", Path: "/t"}}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(fill.ID)
	var script strings.Builder
	script.WriteString("set -e; cd /t\n")
	for _, f := range append(slices.Clone(secretFiles), visibleFiles...) {
		script.WriteString("mkdir -p '" + path.Dir(f) + "' && echo SECRET-" + path.Base(f) + " > '" + f + "'\n")
	}
	script.WriteString("sync\n")
	mustRun(t, ctx, fill, script.String())
	if err := fill.Destroy(ctx); err != nil {
		t.Fatal(err)
	}

	sb, err := c.Create(ctx, sbx.CreateOptions{
		Volumes:      []sbx.VolumeMount{{Volume: "secrets", Path: "/workspace"}},
		PathPolicies: []sbx.PathPolicy{{Path: "/workspace", Preset: "agent-safe"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)

	// User code: open each by name (as root and as uid 1000), and list
	// the whole tree.
	var probe strings.Builder
	probe.WriteString("cd /workspace\n")
	for _, f := range append(slices.Clone(secretFiles), visibleFiles...) {
		probe.WriteString("if cat '" + f + "' >/dev/null 2>&1; then echo 'readable " + f + "'; else echo 'hidden " + f + "'; fi\n")
	}
	probe.WriteString("find . -mindepth 1 | sed 's|^|listed |'\n")
	for _, user := range []string{"", "1000:1000"} {
		res, err := sb.RunOpts(ctx, sbx.ExecOptions{Argv: []string{"sh", "-c", probe.String()}, User: user, Workdir: "/tmp"})
		if err != nil {
			t.Fatal(err)
		}
		if res.Code != 0 {
			t.Fatalf("probe as %q: exit %d, stderr %q", user, res.Code, res.Stderr)
		}
		out := string(res.Stdout)
		for _, f := range secretFiles {
			if !strings.Contains(out, "hidden "+f+"\n") {
				t.Errorf("as user %q: %s is readable, want it hidden", user, f)
			}
			for _, comp := range hiddenPrefixes(f) {
				if strings.Contains(out, "listed ./"+comp+"\n") {
					t.Errorf("as user %q: find lists %s (of %s), want it hidden", user, comp, f)
				}
			}
		}
		for _, f := range visibleFiles {
			if !strings.Contains(out, "readable "+f+"\n") || !strings.Contains(out, "listed ./"+f+"\n") {
				t.Errorf("as user %q: %s is not readable and listed, want it visible", user, f)
			}
		}
		if t.Failed() {
			t.Logf("probe output as %q:\n%s", user, out)
		}
	}

	// The daemon's file API sees the same view.
	for _, f := range secretFiles {
		if b, err := sb.ReadFile(ctx, "/workspace/"+f); err == nil {
			t.Errorf("file API: ReadFile(%s) = %q, want an error", f, b)
		}
	}
	for _, f := range visibleFiles {
		if b, err := sb.ReadFile(ctx, "/workspace/"+f); err != nil || string(b) != "SECRET-"+path.Base(f)+"\n" {
			t.Errorf("file API: ReadFile(%s) = %q, %v, want its content", f, b, err)
		}
	}
	ents, err := sb.ListDir(ctx, "/workspace", true, 0)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, e := range ents {
		listed[strings.TrimPrefix(e.GetPath(), "/workspace/")] = true
	}
	for _, f := range secretFiles {
		for _, comp := range hiddenPrefixes(f) {
			if listed[comp] {
				t.Errorf("file API: ListDir shows %s (of %s), want it hidden", comp, f)
			}
		}
	}
	for _, f := range visibleFiles {
		if !listed[f] {
			t.Errorf("file API: ListDir does not show %s", f)
		}
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.RemoveVolume(ctx, "secrets"); err != nil {
		t.Errorf("removing volume: %v", err)
	}
	d.assertNoLeaks()
}

// hiddenPrefixes is f and, for the files that live in a hidden directory,
// that directory: what a listing must not show.
func hiddenPrefixes(f string) []string {
	out := []string{f}
	for _, dir := range []string{".ssh", ".SSH", "Secrets", ".aws", ".gnupg", ".config/gcloud"} {
		if i := strings.Index(f, dir+"/"); i >= 0 && (i == 0 || f[i-1] == '/') {
			out = append(out, f[:i+len(dir)])
		}
	}
	return out
}

// TestCodebaseGuardExtraRules: `sbx create --codebase NAME:/p:PRESET --rule
// /p:...` guards /p once, with the preset extended by the rule (it used to
// be refused with "guards overlap"); a second, different preset on the
// same path is refused naming both.
func TestCodebaseGuardExtraRules(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	c := d.client()
	src := t.TempDir()
	writeTree(t, src, map[string]string{"src/app.py": "print('app')\n", "notes.sqlite": "db\n", "src/gen/.keep": "", "output/.keep": ""})
	if _, err := c.CreateCodebase(ctx, src, sbx.UploadOptions{Name: "extra"}); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := d.cli("", "create", "--codebase", "extra:/p:agent-safe",
		"--rule", "/p:write:/src/gen:directory:20", "--rule", "/p:none:*.sqlite:glob,nocase:100")
	if code != 0 {
		t.Fatalf("sbx create --codebase extra:/p:agent-safe --rule ...: exit %d: %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	d.remember(id)
	sb, err := c.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if pp := sb.Info.GetPathPolicies(); len(pp) != 1 || pp[0].GetPreset() != "agent-safe" || len(pp[0].GetRules()) != 2 {
		t.Errorf("path policies: got %v, want agent-safe at /p with the two rules", pp)
	}
	got := mustRun(t, ctx, sb, `cd /p
{ echo x >> src/app.py; } 2>&1 | sed 's/.*: //'
echo gen > src/gen/g.txt && cat src/gen/g.txt
cat notes.sqlite 2>&1 | sed 's/.*: //'
{ echo x > output/NEW.SQLITE; } 2>&1 | sed 's/.*: //'`)
	want := "Permission denied\ngen\nNo such file or directory\nPermission denied\n"
	if got != want {
		t.Errorf("in /p:\ngot  %q\nwant %q (src read-only by the preset, src/gen writable by the rule, *.sqlite hidden)", got, want)
	}
	_, errOut, code = d.cli("", "create", "--codebase", "extra:/p:agent-safe", "--guard", "/p:read-only")
	if code == 0 || !strings.Contains(errOut, `"agent-safe"`) || !strings.Contains(errOut, "read-only") {
		t.Errorf("two presets on /p: exit %d, stderr %q, want an error naming both", code, errOut)
	}
	// Through the API, a path policy on the codebase's path merges the same way.
	sb2, err := c.Create(ctx, sbx.CreateOptions{
		Codebases:    []sbx.CodebaseMount{{Codebase: "extra", Path: "/p", Preset: "agent-safe"}},
		PathPolicies: []sbx.PathPolicy{{Path: "/p", Rules: []sbx.PermissionRule{{Pattern: "/src/gen", Type: sbx.Directory, Permission: sbx.PermWrite, Priority: 20}}}},
	})
	if err != nil {
		t.Fatalf("create with a codebase preset and a path policy on its path: %v", err)
	}
	d.remember(sb2.ID)
	if got := mustRun(t, ctx, sb2, "echo gen > /p/src/gen/g.txt && cat /p/src/gen/g.txt"); got != "gen\n" {
		t.Errorf("API merge: got %q, want src/gen writable", got)
	}
	for _, s := range []*sbx.Sandbox{sb, sb2} {
		if err := s.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	d.assertNoLeaks()
}
