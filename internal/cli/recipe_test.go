package cli

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

func TestParseRecipe(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "app", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "app", "main.py"), []byte("print(1)\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "app", "sub", "x"), []byte("x"), 0o600)
	os.Symlink("main.py", filepath.Join(dir, "app", "link"))
	y := `
from: debian:bookworm
steps:
  - apt_install: [python3, python3-pip]
  - pip_install: "numpy pandas"
  - run: echo hi
  - copy: {src: ./app, dest: /app}
  - env: {A: "1", B: two}
  - workdir: /app
  - entrypoint: [python3]
  - cmd: [main.py]
  - user: app
`
	r, err := parseRecipe([]byte(y), dir)
	if err != nil {
		t.Fatal(err)
	}
	tarData := r.GetSteps()[3].GetCopy().GetTar()
	want := &sbxv1.Recipe{From: "debian:bookworm", Steps: []*sbxv1.RecipeStep{
		{Step: &sbxv1.RecipeStep_AptInstall{AptInstall: &sbxv1.PackageList{Packages: []string{"python3", "python3-pip"}}}},
		{Step: &sbxv1.RecipeStep_PipInstall{PipInstall: &sbxv1.PackageList{Packages: []string{"numpy", "pandas"}}}},
		{Step: &sbxv1.RecipeStep_Run{Run: "echo hi"}},
		{Step: &sbxv1.RecipeStep_Copy{Copy: &sbxv1.CopyStep{Dest: "/app", Tar: tarData}}},
		{Step: &sbxv1.RecipeStep_Env{Env: &sbxv1.EnvStep{Env: map[string]string{"A": "1", "B": "two"}}}},
		{Step: &sbxv1.RecipeStep_Workdir{Workdir: "/app"}},
		{Step: &sbxv1.RecipeStep_Entrypoint{Entrypoint: &sbxv1.StringList{Values: []string{"python3"}}}},
		{Step: &sbxv1.RecipeStep_Cmd{Cmd: &sbxv1.StringList{Values: []string{"main.py"}}}},
		{Step: &sbxv1.RecipeStep_User{User: "app"}},
	}}
	if diff := cmp.Diff(want, r, protocmp.Transform()); diff != "" {
		t.Errorf("recipe (-want +got):\n%s", diff)
	}
	var names []string
	tr := tar.NewReader(bytes.NewReader(tarData))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name+":"+h.Linkname)
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s owned by %d:%d; want 0:0", h.Name, h.Uid, h.Gid)
		}
	}
	if diff := cmp.Diff([]string{"link:main.py", "main.py:", "sub/:", "sub/x:"}, names); diff != "" {
		t.Errorf("copy tar (-want +got):\n%s", diff)
	}
	again, err := parseRecipe([]byte(y), dir)
	if err != nil || !bytes.Equal(again.GetSteps()[3].GetCopy().GetTar(), tarData) {
		t.Error("the copy tar of an unchanged dir is not byte for byte the same")
	}
}

func TestParseRecipeErrors(t *testing.T) {
	for _, y := range []string{
		"steps: []",
		"from: x\nstepz: []",
		"from: x\nsteps:\n  - frobnicate: 1",
		"from: x\nsteps:\n  - run: a\n    workdir: /b",
		"from: x\nsteps:\n  - copy: {src: ./missing, dest: /app}",
		"from: x\nsteps:\n  - env: [a]",
		"from: x\nsteps:\n  - apt_install: []",
	} {
		if _, err := parseRecipe([]byte(y), t.TempDir()); err == nil {
			t.Errorf("parseRecipe(%q) succeeded", strings.ReplaceAll(y, "\n", `\n`))
		}
	}
}

// TestParseRecipeCopyConfined: a recipe may be hostile, so its copy steps
// read only the build context. Sources outside it are refused, naming the
// step and src; symlinks are never followed, and those pointing out of
// what is copied are refused.
func TestParseRecipeCopyConfined(t *testing.T) {
	top := t.TempDir()
	ctxDir := filepath.Join(top, "ctx")
	for _, d := range []string{"ctx/app", "ctx/inner", "ctx/good/sub", "ctx/chain/s"} {
		if err := os.MkdirAll(filepath.Join(top, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	const secret = "TOPSECRET-outside-the-context"
	for p, body := range map[string]string{"x": secret, "ctx/app/main.py": "print(1)\n", "ctx/inner/ok": "inside\n",
		"ctx/good/a": "a\n", "ctx/good/sub/b": "b\n"} {
		if err := os.WriteFile(filepath.Join(top, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{"ctx/etclink": "/etc", "ctx/app/up": "../x", "ctx/app/abs": filepath.Join(top, "x"),
		"ctx/innerlink": "inner", "ctx/good/sub/toa": "../a", "ctx/good/self": ".",
		"ctx/chain/l": "s/x/..", "ctx/chain/s/x": ".."} {
		if err := os.Symlink(target, filepath.Join(top, link)); err != nil {
			t.Fatal(err)
		}
	}
	recipe := func(src string) []byte {
		return []byte("from: x\nsteps:\n  - run: true\n  - copy: {src: '" + src + "', dest: /app}\n")
	}

	for _, tc := range []struct{ src, want string }{
		{"../x", `recipe step 2 (copy): src "../x": has a ".." component`},
		{"/etc/hostname", `recipe step 2 (copy): src "/etc/hostname": is an absolute path`},
		{"sub/../../x", `recipe step 2 (copy): src "sub/../../x": has a ".." component`},
		{"app/../inner", `recipe step 2 (copy): src "app/../inner": has a ".." component`},
		{"etclink/hostname", `recipe step 2 (copy): src "etclink/hostname": etclink/hostname leads out of the build context `},
		{"etclink", `recipe step 2 (copy): src "etclink" in build context ` + ctxDir + `: symlink etclink -> "/etc" points out of what is copied`},
		{"app/up", `recipe step 2 (copy): src "app/up" in build context ` + ctxDir + `: symlink app/up -> "../x" points out of what is copied`},
		{"app", `recipe step 2 (copy): src "app" in build context ` + ctxDir + `: symlink app/abs -> "` + filepath.Join(top, "x") + `" points out`},
		{".", `recipe step 2 (copy): src "." in build context ` + ctxDir + `: symlink app/abs -> "` + filepath.Join(top, "x") + `" points out`},
		{"good/sub", `recipe step 2 (copy): src "good/sub" in build context ` + ctxDir + `: symlink good/sub/toa -> "../a" points out`},
		{"missing", `recipe step 2 (copy): src "missing" in build context`},
		// Each inside alone; together l is chain's parent.
		{"chain", `recipe step 2 (copy): src "chain" in build context ` + ctxDir + `: symlink chain/l -> "s/x/.." points out`},
	} {
		_, err := parseRecipe(recipe(tc.src), ctxDir)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("copy src %q: got %v; want an error containing %q", tc.src, err, tc.want)
		}
	}

	for _, tc := range []struct {
		src   string
		names []string
	}{
		{"good", []string{"a:", "self:.", "sub/:", "sub/b:", "sub/toa:../a"}},
		{"innerlink/ok", []string{"ok:"}}, // a link inside the context may be gone through
		{"./inner/", []string{"ok:"}},
		{"app/main.py", []string{"main.py:"}},
	} {
		r, err := parseRecipe(recipe(tc.src), ctxDir)
		if err != nil {
			t.Errorf("copy src %q: %v", tc.src, err)
			continue
		}
		data := r.GetSteps()[1].GetCopy().GetTar()
		if bytes.Contains(data, []byte(secret)) {
			t.Errorf("copy src %q: the tar holds a file from outside the context", tc.src)
		}
		var names []string
		tr := tar.NewReader(bytes.NewReader(data))
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, h.Name+":"+h.Linkname)
		}
		if diff := cmp.Diff(tc.names, names); diff != "" {
			t.Errorf("copy src %q: tar entries (-want +got):\n%s", tc.src, diff)
		}
	}

	// --context: a recipe elsewhere reads only the given directory.
	r, err := parseRecipe(recipe("ok"), filepath.Join(ctxDir, "inner"))
	if err != nil || len(r.GetSteps()[1].GetCopy().GetTar()) == 0 {
		t.Errorf("copy from another context: %v", err)
	}
}
