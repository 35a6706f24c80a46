package permrules

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

const (
	glob = sbxv1.PatternType_PATTERN_TYPE_GLOB
	dir  = sbxv1.PatternType_PATTERN_TYPE_DIRECTORY
	file = sbxv1.PatternType_PATTERN_TYPE_FILE
)

func r(pat string, typ sbxv1.PatternType, perm Perm, prio int32) *sbxv1.PermissionRule {
	return &sbxv1.PermissionRule{Pattern: pat, Type: typ, Permission: sbxv1.Permission(perm), Priority: prio}
}

func mustCompile(t *testing.T, p *sbxv1.PathPolicy) *Policy {
	t.Helper()
	c, err := Compile(p)
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return c
}

func TestDecide(t *testing.T) {
	tests := []struct {
		name  string
		pol   *sbxv1.PathPolicy
		path  string
		isDir bool
		want  Perm
	}{
		{"no rules: write", &sbxv1.PathPolicy{Path: "/w"}, "/a", false, Write},
		{"default", &sbxv1.PathPolicy{Path: "/w", DefaultPermission: sbxv1.Permission_PERMISSION_READ}, "/a/b", false, Read},
		{"glob basename any depth", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("*.key", glob, None, 0)}}, "/a/b/x.key", false, None},
		{"glob basename no match", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("*.key", glob, None, 0)}}, "/a/b/x.keys", false, Write},
		{"glob anchored", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("src/*.go", glob, Read, 0)}}, "/src/a.go", false, Read},
		{"glob anchored not deeper dir", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("src/*.go", glob, Read, 0)}}, "/x/src/a.go", false, Write},
		{"glob doublestar", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("/out/**", glob, Read, 0)}}, "/out/a/b/c", false, Read},
		{"glob doublestar not the dir itself", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("/out/**/x", glob, Read, 0)}}, "/out", true, Write},
		{"glob doublestar zero comps", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("**/x", glob, Read, 0)}}, "/x", false, Read},
		{"dir inherits", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("/output", dir, Read, 0)}}, "/output/a/b", false, Read},
		{"dir no prefix confusion", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("/output", dir, Read, 0)}}, "/output2/a", false, Write},
		{"dir unanchored any depth", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("secrets", dir, None, 0)}}, "/a/secrets/k", false, None},
		{"file exact", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("config/prod.yaml", file, View, 0)}}, "/config/prod.yaml", false, View},
		{"file no inheritance", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("/config", file, View, 0)}}, "/config/x", false, Write},
		{"priority wins over type", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("/a/b", file, Write, 0), r("*", glob, Read, 1)}}, "/a/b", false, Read},
		{"file over dir at equal priority", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("/a/b", file, Write, 0), r("/a", dir, Read, 0)}}, "/a/b", false, Write},
		{"dir over glob at equal priority", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("*.txt", glob, Read, 0), r("/a", dir, View, 0)}}, "/a/x.txt", false, View},
		{"longer pattern at equal type", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("/src", dir, Read, 0), r("/src/gen", dir, Write, 0)}}, "/src/gen/x", false, Write},
		{"write inside read dir", &sbxv1.PathPolicy{Path: "/w", DefaultPermission: sbxv1.Permission_PERMISSION_READ, Rules: []*sbxv1.PermissionRule{r("/src/out", dir, Write, 0)}}, "/src/out/x", false, Write},
		{"hidden dir hides equal priority file rule", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("secrets", dir, None, 5), r("/secrets/pub", file, Read, 5)}}, "/secrets/pub", false, None},
		{"higher priority exposes in hidden dir", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("secrets", dir, None, 5), r("/secrets/pub", file, Read, 6)}}, "/secrets/pub", false, Read},
		{"hidden dir with exposed child is view", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("secrets", dir, None, 5), r("/secrets/pub", file, Read, 6)}}, "/secrets", true, View},
		{"hidden dir without exposed child", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("secrets", dir, None, 5), r("/other/pub", file, Read, 6)}}, "/secrets", true, None},
		{"sibling of exposed stays hidden", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("secrets", dir, None, 5), r("/secrets/pub", file, Read, 6)}}, "/secrets/priv", false, None},
		{"hidden file not promoted", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("*.key", glob, None, 5), r("*.md", glob, Read, 6)}}, "/a.key", false, None},
		{"root never below view", &sbxv1.PathPolicy{Path: "/w", DefaultPermission: sbxv1.Permission_PERMISSION_NONE}, "/", true, View},
		{"default none, rule exposes", &sbxv1.PathPolicy{Path: "/w", DefaultPermission: sbxv1.Permission_PERMISSION_NONE, Rules: []*sbxv1.PermissionRule{r("/src", dir, Read, 0)}}, "/src/a", false, Read},
		{"user rule replaces preset rule", &sbxv1.PathPolicy{Path: "/w", Preset: "agent-safe", Rules: []*sbxv1.PermissionRule{r("*.pem", glob, Read, 0)}}, "/cert.pem", false, Read},
		{"later rule wins a full tie", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("/a", dir, Read, 0), r("/a", dir, View, 0)}}, "/a/x", false, View},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustCompile(t, tt.pol)
			if got := p.Decide(tt.path, tt.isDir); got != tt.want {
				t.Errorf("Decide(%q) = %v, want %v", tt.path, got, tt.want)
			}
		})
	}
}

func TestPresets(t *testing.T) {
	tests := []struct {
		preset string
		path   string
		isDir  bool
		want   Perm
	}{
		{"view-only", "/src/a.go", false, View},
		{"view-only", "/src", true, View},
		{"read-only", "/src/a.go", false, Read},
		{"agent-safe", "/src/a.go", false, Read},
		{"agent-safe", "/output/x", false, Write},
		{"agent-safe", "/tmp/x", false, Write},
		{"agent-safe", "/output/x.key", false, None},
		{"agent-safe", "/.env", false, None},
		{"agent-safe", "/sub/.env.local", false, None},
		{"agent-safe", "/secrets/x", false, None},
		{"agent-safe", "/a/secrets", true, None},
		{"agent-safe", "/a.pem", false, None},
		{"agent-safe", "/credentials.json", false, None},
		{"agent-safe", "/.git/config", false, None},
		{"agent-safe", "/.gitignore", false, Read},
		{"development", "/src/a.go", false, Write},
		{"development", "/.git/config", false, Write},
		{"development", "/.env", false, None},
		{"development", "/secrets/x", false, None},
		{"full-access", "/.env", false, Write},
		{"full-access", "/.ssh/id_rsa", false, Write},
	}
	for _, tt := range tests {
		t.Run(tt.preset+tt.path, func(t *testing.T) {
			p := mustCompile(t, &sbxv1.PathPolicy{Path: "/workspace", Preset: tt.preset})
			if got := p.Decide(tt.path, tt.isDir); got != tt.want {
				t.Errorf("%s: Decide(%q) = %v, want %v", tt.preset, tt.path, got, tt.want)
			}
		})
	}
}

func TestCompileErrors(t *testing.T) {
	tests := []struct {
		name string
		pol  *sbxv1.PathPolicy
		want string
	}{
		{"relative", &sbxv1.PathPolicy{Path: "workspace"}, "relative"},
		{"empty path", &sbxv1.PathPolicy{}, "empty"},
		{"root", &sbxv1.PathPolicy{Path: "/"}, "cannot guard /"},
		{"proc", &sbxv1.PathPolicy{Path: "/proc/self"}, "inside /proc"},
		{"sys", &sbxv1.PathPolicy{Path: "/sys"}, "inside /sys"},
		{"dev", &sbxv1.PathPolicy{Path: "/dev/"}, "inside /dev"},
		{"sbx", &sbxv1.PathPolicy{Path: "/.sbx"}, "inside /.sbx"},
		{"dotdot", &sbxv1.PathPolicy{Path: "/w/../proc"}, "\"..\""},
		{"unknown preset", &sbxv1.PathPolicy{Path: "/w", Preset: "yolo"}, "unknown preset \"yolo\""},
		{"unknown default", &sbxv1.PathPolicy{Path: "/w", DefaultPermission: 9}, "unknown default permission"},
		{"missing permission", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{{Pattern: "x"}}}, "permission is required"},
		{"unknown permission", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{{Pattern: "x", Permission: 7}}}, "unknown permission 7"},
		{"unknown type", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{{Pattern: "x", Type: 9, Permission: 1}}}, "unknown pattern type"},
		{"bad glob", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("[a", glob, None, 0)}}, "bad pattern"},
		{"empty pattern", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("", glob, None, 0)}}, "empty pattern"},
		{"dotdot pattern", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("a/../b", glob, None, 0)}}, "\"..\" component"},
		{"double slash", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("a//b", glob, None, 0)}}, "empty component"},
		{"partial doublestar", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("a**", glob, None, 0)}}, "whole path component"},
		{"doublestar in dir", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("**/x", dir, None, 0)}}, "only allowed in glob"},
		{"root glob", &sbxv1.PathPolicy{Path: "/w", Rules: []*sbxv1.PermissionRule{r("/", glob, None, 0)}}, "names the root"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Compile(tt.pol)
			if err == nil {
				t.Fatalf("Compile succeeded, want an error containing %q", tt.want)
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got error %q, want ErrInvalid containing %q", err, tt.want)
			}
		})
	}
}

func TestCheckPoliciesOverlap(t *testing.T) {
	_, err := CheckPolicies([]*sbxv1.PathPolicy{{Path: "/w"}, {Path: "/w/sub"}})
	if err == nil || !strings.Contains(err.Error(), "overlap") {
		t.Errorf("got %v, want an overlap error", err)
	}
	if _, err := CheckPolicies([]*sbxv1.PathPolicy{{Path: "/w"}, {Path: "/w2"}}); err != nil {
		t.Errorf("got %v for disjoint guards, want nil", err)
	}
}

// TestPresetSecrets checks that agent-safe and development hide the common
// secret files, whatever their case and depth, and leave their neighbours
// alone.
func TestPresetSecrets(t *testing.T) {
	hidden := []string{
		"/.ssh/id_rsa", "/.ssh/id_ed25519.pub", "/.ssh/config", "/.SSH/authorized_keys", "/home/u/.ssh/known_hosts",
		"/deploy/id_rsa", "/deploy/ID_ED25519", "/keys/id_ecdsa_sk",
		"/.env", "/.ENV", "/.Env.local", "/app/.envrc",
		"/secrets", "/Secrets/x", "/SECRETS/deep/x", "/config/secrets.yaml", "/Secrets.json",
		"/key.PEM", "/a/b/server.Key", "/cert.pem", "/credentials.json", "/.aws/credentials", "/.aws/config", "/.AWS/credentials",
		"/.netrc", "/.NETRC", "/_netrc", "/.npmrc", "/web/.npmrc", "/.pypirc", "/.pgpass", "/.my.cnf", "/.htpasswd",
		"/.git-credentials", "/.gitcookies", "/.vault-token", "/.terraformrc",
		"/.docker/config.json", "/home/u/.docker/config.json", "/.Docker/Config.JSON", "/.dockercfg",
		"/.kube/config", "/x/.kube/config", "/.KUBE/CONFIG", "/kubeconfig", "/prod.kubeconfig",
		"/.config/gcloud", "/.config/gcloud/application_default_credentials.json", "/home/u/.config/gcloud/x",
		"/.azure/accessTokens.json", "/.gnupg/private-keys-v1.d/x.key", "/.s3cfg", "/.boto",
		"/cert.p12", "/cert.P12", "/cert.pfx", "/AuthKey_X.p8", "/app/release.jks", "/release.keystore", "/putty.ppk", "/db.kdbx",
		"/terraform.tfstate", "/infra/Terraform.TFSTATE", "/terraform.tfstate.backup", "/output/id_rsa",
	}
	visible := []string{
		"/id_rsa.pub", "/deploy/id_ed25519.pub", "/id_data.json", "/keyboard.go", "/src/key.go", "/env.go", "/environment.md",
		"/config.json", "/.docker/Dockerfile", "/.kube/cache/x", "/.config/other/x", "/certs/ca.crt",
		"/secret_santa.md", "/docs/how-to-rotate-credentials.md", "/main.tf", "/terraform.tfvars", "/service-account.json",
	}
	for _, preset := range []string{"agent-safe", "development"} {
		p := mustCompile(t, &sbxv1.PathPolicy{Path: "/workspace", Preset: preset})
		for _, path := range hidden {
			if got := p.Decide(path, false); got != None {
				t.Errorf("%s: Decide(%q) = %v, want none", preset, path, got)
			}
		}
		for _, path := range visible {
			if got := p.Decide(path, false); got == None {
				t.Errorf("%s: Decide(%q) = none, want it visible", preset, path)
			}
		}
	}
}

func TestCaseInsensitiveRule(t *testing.T) {
	ci := func(pat string, typ sbxv1.PatternType, perm Perm, prio int32) *sbxv1.PermissionRule {
		pr := r(pat, typ, perm, prio)
		pr.CaseInsensitive = true
		return pr
	}
	tests := []struct {
		name  string
		rules []*sbxv1.PermissionRule
		path  string
		want  Perm
	}{
		{"case-sensitive by default", []*sbxv1.PermissionRule{r("*.pem", glob, None, 0)}, "/KEY.PEM", Write},
		{"glob", []*sbxv1.PermissionRule{ci("*.pem", glob, None, 0)}, "/KEY.PEM", None},
		{"glob pattern upper", []*sbxv1.PermissionRule{ci("*.PEM", glob, None, 0)}, "/a/key.pem", None},
		{"glob class", []*sbxv1.PermissionRule{ci("[a-c]*.txt", glob, None, 0)}, "/B.TXT", None},
		{"glob class no match", []*sbxv1.PermissionRule{ci("[a-c]*.txt", glob, None, 0)}, "/D.TXT", Write},
		{"glob anchored", []*sbxv1.PermissionRule{ci("/Src/*.go", glob, Read, 0)}, "/src/A.GO", Read},
		{"doublestar", []*sbxv1.PermissionRule{ci("**/.kube/config", glob, None, 0)}, "/a/.Kube/Config", None},
		{"directory inherits", []*sbxv1.PermissionRule{ci("secrets", dir, None, 0)}, "/a/SeCrEtS/k", None},
		{"file", []*sbxv1.PermissionRule{ci("/config/prod.yaml", file, View, 0)}, "/CONFIG/Prod.yaml", View},
		{"unicode", []*sbxv1.PermissionRule{ci("straße*", glob, None, 0)}, "/STRASSE", Write},
		{"unicode simple fold", []*sbxv1.PermissionRule{ci("ÄRGER", glob, None, 0)}, "/ärger", None},
		{"long s folds like s", []*sbxv1.PermissionRule{ci("secret", glob, None, 0)}, "/ſecret", None},
		{"kelvin sign folds like k", []*sbxv1.PermissionRule{ci("*.key", glob, None, 0)}, "/a.\u212aey", None},
		{"sensitive rule beside insensitive", []*sbxv1.PermissionRule{ci("*.pem", glob, None, 0), r("/Pub.pem", file, Read, 5)}, "/pub.pem", None},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustCompile(t, &sbxv1.PathPolicy{Path: "/w", Rules: tt.rules})
			if got := p.Decide(tt.path, false); got != tt.want {
				t.Errorf("Decide(%q) = %v, want %v", tt.path, got, tt.want)
			}
		})
	}
}

func TestFoldCase(t *testing.T) {
	for _, pair := range [][2]string{{"key.pem", "KEY.PEM"}, {"Secrets", "sEcReTs"}, {"ſ", "S"}, {"\u212a", "k"}, {"Ärger", "äRGER"}} {
		if a, b := foldCase(pair[0]), foldCase(pair[1]); a != b {
			t.Errorf("foldCase(%q) = %q, foldCase(%q) = %q, want equal", pair[0], a, pair[1], b)
		}
	}
	if a, b := foldCase("a"), foldCase("b"); a == b {
		t.Errorf("foldCase(a) == foldCase(b) = %q", a)
	}
}

// TestEffectiveMatchesNaive compares Decide's one-pass evaluation with the
// definition (the winner of every prefix, rule by rule) on generated paths.
func TestEffectiveMatchesNaive(t *testing.T) {
	naive := func(p *Policy, rel string) (Perm, int64) {
		pc := p.pathComps(rel)
		perm, prio := p.permOf(p.winner(pc))
		for k := 1; k < len(pc.raw); k++ {
			if aperm, aprio := p.permOf(p.winner(pc.prefix(k))); aperm == None && aprio >= prio {
				return None, aprio
			}
		}
		return perm, prio
	}
	pols := []*sbxv1.PathPolicy{
		{Path: "/w", Preset: "agent-safe"},
		{Path: "/w", Preset: "development", Rules: []*sbxv1.PermissionRule{r("/secrets/pub", file, Read, 101), r("*.md", glob, View, 100)}},
		{Path: "/w", Rules: []*sbxv1.PermissionRule{r("a", dir, Read, 0), r("a", glob, View, 0), r("/a/**/b", glob, None, 0), r("b*", glob, Write, 0), r("*b", glob, None, 0)}},
	}
	names := []string{"a", "b", "ab", "ba", "secrets", "Secrets", ".git", "x.md", "pub", "output", ".ssh", "id_rsa", "k.PEM", ".kube", "config"}
	for i, pol := range pols {
		p := mustCompile(t, pol)
		var walk func(rel string, depth int)
		walk = func(rel string, depth int) {
			gotPerm, gotPrio := p.effective(p.pathComps(rel))
			wantPerm, wantPrio := naive(p, rel)
			if gotPerm != wantPerm || gotPrio != wantPrio {
				t.Errorf("policy %d: effective(%q) = %v/%d, want %v/%d", i, rel, gotPerm, gotPrio, wantPerm, wantPrio)
			}
			if depth == 3 {
				return
			}
			for _, n := range names {
				walk(rel+"/"+n, depth+1)
			}
		}
		walk("", 0)
	}
}

// TestPresetsDocumented checks that the secrets row of the presets table in
// docs/ARCHITECTURE.md lists exactly secretPatterns, directories marked.
func TestPresetsDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "| *secrets* (both) |") {
			row = line
		}
	}
	if row == "" {
		t.Fatal("docs/ARCHITECTURE.md has no \"| *secrets* (both) |\" row in its presets table")
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("`([^`]+)`( \\(directory\\))?").FindAllStringSubmatch(row, -1) {
		documented[m[1]+m[2]] = true
	}
	for _, s := range secretPatterns {
		name := s.pattern
		if s.typ == dirType {
			name += " (directory)"
		}
		if !documented[name] {
			t.Errorf("secret pattern %q is not in the docs' presets table", name)
		}
		delete(documented, name)
	}
	for name := range documented {
		t.Errorf("the docs' presets table lists %q, which is no secret pattern", name)
	}
	if n := len(presets["agent-safe"].rules); !strings.Contains(string(b), fmt.Sprintf("agent-safe's %d rules", n)) {
		t.Errorf("docs/ARCHITECTURE.md does not say \"agent-safe's %d rules\"", n)
	}
}
