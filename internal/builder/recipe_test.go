package builder

import (
	"archive/tar"
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/image"
)

func run(s string) *sbxv1.RecipeStep { return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Run{Run: s}} }
func env(kv map[string]string) *sbxv1.RecipeStep {
	return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Env{Env: &sbxv1.EnvStep{Env: kv}}}
}
func cp(dest string, tar []byte) *sbxv1.RecipeStep {
	return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Copy{Copy: &sbxv1.CopyStep{Dest: dest, Tar: tar}}}
}
func apt(pkgs ...string) *sbxv1.RecipeStep {
	return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_AptInstall{AptInstall: &sbxv1.PackageList{Packages: pkgs}}}
}

func TestStepKey(t *testing.T) {
	const parent = "sha256:aaaa"
	k := stepKey(parent, run("echo hi"))
	if len(k) != 64 || k != stepKey(parent, run("echo hi")) {
		t.Fatalf("stepKey not a stable sha256 hex: %q", k)
	}
	same := []struct {
		name string
		a, b *sbxv1.RecipeStep
	}{
		{"env order", env(map[string]string{"A": "1", "B": "2"}), env(map[string]string{"B": "2", "A": "1"})},
		{"copy by content", cp("/app", []byte("tar")), cp("/app", []byte("tar"))},
	}
	for _, c := range same {
		if stepKey(parent, c.a) != stepKey(parent, c.b) {
			t.Errorf("%s: keys differ", c.name)
		}
	}
	differ := []struct {
		name   string
		pa, pb string
		a, b   *sbxv1.RecipeStep
	}{
		{"parent", parent, "sha256:bbbb", run("x"), run("x")},
		{"command", parent, parent, run("x"), run("y")},
		{"kind", parent, parent, run("/app"), &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Workdir{Workdir: "/app"}}},
		{"copy tar", parent, parent, cp("/app", []byte("one")), cp("/app", []byte("two"))},
		{"copy dest", parent, parent, cp("/app", []byte("one")), cp("/srv", []byte("one"))},
		{"packages", parent, parent, apt("a", "b"), apt("a b")},
		{"env value", parent, parent, env(map[string]string{"A": "1"}), env(map[string]string{"A": "2"})},
	}
	for _, c := range differ {
		if stepKey(c.pa, c.a) == stepKey(c.pb, c.b) {
			t.Errorf("%s: keys are equal", c.name)
		}
	}
}

func TestValidate(t *testing.T) {
	bad := []*sbxv1.Recipe{
		{Steps: []*sbxv1.RecipeStep{run("x")}},
		{From: "x", Steps: []*sbxv1.RecipeStep{{}}},
		{From: "x", Steps: []*sbxv1.RecipeStep{apt()}},
		{From: "x", Steps: []*sbxv1.RecipeStep{apt("-oAPT::x=y")}},
		{From: "x", Steps: []*sbxv1.RecipeStep{apt("a;rm -rf /")}},
		{From: "x", Steps: []*sbxv1.RecipeStep{run("  ")}},
		{From: "x", Steps: []*sbxv1.RecipeStep{cp("relative", nil)}},
		{From: "x", Steps: []*sbxv1.RecipeStep{env(map[string]string{"1A": "x"})}},
		{From: "x", Steps: []*sbxv1.RecipeStep{{Step: &sbxv1.RecipeStep_Workdir{Workdir: "app"}}}},
		{From: "x", Steps: []*sbxv1.RecipeStep{{Step: &sbxv1.RecipeStep_Python{Python: "3.11; rm -rf /"}}}},
		{From: "x", Steps: []*sbxv1.RecipeStep{{Step: &sbxv1.RecipeStep_Python{Python: "2.7"}}}},
	}
	for i, r := range bad {
		if err := validate(r); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("bad recipe %d: validate = %v; want InvalidArgument", i, err)
		}
	}
	good := &sbxv1.Recipe{From: "debian:bookworm", Steps: []*sbxv1.RecipeStep{
		apt("python3", "libfoo1.2+dfsg"), run("echo hi"), cp("/app", nil), env(map[string]string{"A": "1"}),
		{Step: &sbxv1.RecipeStep_PipInstall{PipInstall: &sbxv1.PackageList{Packages: []string{"numpy==2.0", "requests[socks]>=2"}}}},
		{Step: &sbxv1.RecipeStep_NpmInstall{NpmInstall: &sbxv1.PackageList{Packages: []string{"@scope/pkg@1.2.3"}}}},
		{Step: &sbxv1.RecipeStep_Python{Python: "3.11"}},
	}}
	if err := validate(good); err != nil {
		t.Errorf("validate(good) = %v", err)
	}
}

func TestCommandQuotes(t *testing.T) {
	got := command(apt("python3", "it's"))
	if !strings.Contains(got, `install -y --no-install-recommends 'python3' 'it'\''s'`) {
		t.Errorf("apt command: %s", got)
	}
	if got := command(run("echo $HOME")); got != "echo $HOME" {
		t.Errorf("run command: %q", got)
	}
}

// Package steps leave apt's lists in the image, so that a later step or a
// sandbox can apt-get install without an update first.
func TestAptStepsKeepLists(t *testing.T) {
	for _, s := range []*sbxv1.RecipeStep{apt("jq"), {Step: &sbxv1.RecipeStep_Python{Python: "3.11"}}} {
		if got := command(s); strings.Contains(got, "/var/lib/apt/lists") || !strings.Contains(got, "apt-get update") {
			t.Errorf("%s: command %q removes the apt lists or does not fetch them", describe(s), got)
		}
	}
}

func TestApplyConfig(t *testing.T) {
	base := image.ImageConfig{Env: []string{"PATH=/bin", "A=old"}, WorkingDir: "/"}
	got := applyConfig(base, env(map[string]string{"A": "new", "B": "b"}))
	want := image.ImageConfig{Env: []string{"PATH=/bin", "A=new", "B=b"}, WorkingDir: "/"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("env step (-want +got):\n%s", diff)
	}
	if base.Env[1] != "A=old" {
		t.Error("applyConfig changed its input")
	}
	got = applyConfig(base, &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Cmd{Cmd: &sbxv1.StringList{Values: []string{"a", "b"}}}})
	if diff := cmp.Diff([]string{"a", "b"}, got.Cmd); diff != "" {
		t.Errorf("cmd step (-want +got):\n%s", diff)
	}
}

func TestDescribe(t *testing.T) {
	for step, want := range map[*sbxv1.RecipeStep]string{
		run("make"):   "RUN make",
		apt("a", "b"): "APT_INSTALL a b",
		env(map[string]string{"B": "2", "A": "1"}): "ENV A=1 B=2",
		cp("/app", make([]byte, 10)):               "COPY (10 bytes of tar) /app",
	} {
		if got := describe(step); got != want {
			t.Errorf("describe = %q; want %q", got, want)
		}
	}
}

func TestHostMirror(t *testing.T) {
	if got, want := hostMirror("testdata/apt"), "http://deb.debian.org/debian"; got != want {
		t.Errorf("hostMirror = %q; want %q", got, want)
	}
	if got := hostMirror("testdata/none"); got != defaultMirror {
		t.Errorf("hostMirror without sources = %q; want the default", got)
	}
	list := "# comment\ndeb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main\n"
	if got := mirrorFromList(list); got != "http://mirror.example/debian" {
		t.Errorf("mirrorFromList = %q", got)
	}
	if !isDebianBookworm("debian:bookworm") || !isDebianBookworm("docker.io/library/debian:bookworm") || isDebianBookworm("debian:trixie") {
		t.Error("isDebianBookworm")
	}
}

func TestTarContentSum(t *testing.T) {
	mk := func(mtime int64, body string) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "f", Mode: 0o644, Size: int64(len(body)), ModTime: time.Unix(mtime, 0)})
		tw.Write([]byte(body))
		tw.Close()
		return buf.Bytes()
	}
	if tarContentSum(mk(1, "a")) != tarContentSum(mk(2, "a")) {
		t.Error("a different mtime changes the sum")
	}
	if tarContentSum(mk(1, "a")) == tarContentSum(mk(1, "b")) {
		t.Error("different content, same sum")
	}
	if got := tarContentSum([]byte("junk")); !strings.HasPrefix(got, "raw:") {
		t.Errorf("sum of junk = %q; want a raw hash", got)
	}
}
