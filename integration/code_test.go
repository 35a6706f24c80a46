package integration

import (
	"archive/zip"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// codeSandbox starts a daemon and one host-image sandbox for code runs.
func codeSandbox(t *testing.T) (*daemon, *sbx.Sandbox, context.Context) {
	t.Helper()
	d := startDaemon(t)
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(d.dataDir, "oci", "boxes", "*", "agent.log"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				t.Logf("%s:\n%s", l, tail(string(b), 30))
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	sb, err := d.client().Create(ctx, sbx.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	return d, sb, ctx
}

func hostHas(cmd string, args ...string) bool {
	return exec.Command(cmd, args...).Run() == nil
}

func TestRunCodeOneShot(t *testing.T) {
	d, sb, ctx := codeSandbox(t)

	t.Run("python", func(t *testing.T) {
		var live bytes.Buffer
		res, err := sb.RunCode(ctx, "python", "import sys\nprint('hello')\nprint('oops', file=sys.stderr)\nsys.exit(3)\n", sbx.RunCodeOptions{Stdout: &live})
		if err != nil {
			t.Fatal(err)
		}
		if string(res.Stdout) != "hello\n" || string(res.Stderr) != "oops\n" || res.ExitCode != 3 || live.String() != "hello\n" {
			t.Errorf("got stdout %q stderr %q exit %d live %q, want hello/oops/3", res.Stdout, res.Stderr, res.ExitCode, live.String())
		}
	})
	t.Run("python-exception", func(t *testing.T) {
		res, err := sb.RunCode(ctx, "python", "1/0\n", sbx.RunCodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 1 || !strings.Contains(string(res.Stderr), "ZeroDivisionError") {
			t.Errorf("got exit %d stderr %q, want 1 and a ZeroDivisionError", res.ExitCode, res.Stderr)
		}
	})
	t.Run("outputs-file", func(t *testing.T) {
		res, err := sb.RunCode(ctx, "python", "import os\nopen(os.path.join(os.environ['SBX_OUTPUT_DIR'], 'data.csv'), 'w').write('a,b\\n1,2\\n')\n", sbx.RunCodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Artifacts) != 1 || res.Artifacts[0].GetName() != "data.csv" || string(res.Artifacts[0].GetContent()) != "a,b\n1,2\n" ||
			res.Artifacts[0].GetMime() != "text/csv" || res.Artifacts[0].GetSize() != 8 {
			t.Errorf("got artifacts %v, want data.csv", res.Artifacts)
		}
	})
	t.Run("matplotlib", func(t *testing.T) {
		if !hostHas("/usr/bin/python3", "-c", "import matplotlib") {
			t.Skip("host python3 has no matplotlib (scripts/install-deps.sh installs python3-matplotlib)")
		}
		res, err := sb.RunCode(ctx, "python", "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()\n", sbx.RunCodeOptions{Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Artifacts) != 1 || res.Artifacts[0].GetFormat() != "png" || !bytes.HasPrefix(res.Artifacts[0].GetContent(), []byte("\x89PNG")) {
			t.Errorf("got artifacts %v (stderr %q), want one PNG", res.Artifacts, res.Stderr)
		}
	})
	t.Run("bash", func(t *testing.T) {
		res, err := sb.RunCode(ctx, "bash", "echo $((6*7))\necho hi > \"$SBX_OUTPUT_DIR/hi.txt\"\nexit 2\n", sbx.RunCodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if string(res.Stdout) != "42\n" || res.ExitCode != 2 || len(res.Artifacts) != 1 || res.Artifacts[0].GetName() != "hi.txt" {
			t.Errorf("got stdout %q exit %d artifacts %v", res.Stdout, res.ExitCode, res.Artifacts)
		}
	})
	t.Run("javascript", func(t *testing.T) {
		res, err := sb.RunCode(ctx, "js", "console.log([1,2,3].map(x => x*2).join(','))", sbx.RunCodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if string(res.Stdout) != "2,4,6\n" || res.ExitCode != 0 {
			t.Errorf("got stdout %q exit %d stderr %q", res.Stdout, res.ExitCode, res.Stderr)
		}
	})
	t.Run("cpp", func(t *testing.T) {
		if !hostHas("sh", "-c", "command -v g++") {
			t.Skip("no g++ on the host")
		}
		res, err := sb.RunCode(ctx, "c++", "#include <iostream>\nint main() { std::cout << \"sum \" << 2+3 << std::endl; return 4; }\n", sbx.RunCodeOptions{Timeout: 2 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if string(res.Stdout) != "sum 5\n" || res.ExitCode != 4 {
			t.Errorf("got stdout %q exit %d stderr %q", res.Stdout, res.ExitCode, res.Stderr)
		}
		res, err = sb.RunCode(ctx, "cpp", "int main() { return undefined_thing; }\n", sbx.RunCodeOptions{Timeout: 2 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(res.Error, "compilation failed") || !strings.Contains(string(res.Stderr), "undefined_thing") {
			t.Errorf("got error %q stderr %q, want a compile error", res.Error, res.Stderr)
		}
	})
	// More languages, each when the host (and so the host image) has its toolchain;
	// scripts/install-deps.sh installs them.
	for _, tc := range []struct{ lang, tool, code, want string }{
		{"java", "javac", "public class Main { public static void main(String[] a) { System.out.println(\"java \" + (6*7)); } }\n", "java 42\n"},
		{"ruby", "ruby", "puts [1, 2, 3].sum * 7\n", "42\n"},
		{"typescript", "tsc", "const n: number = 6 * 7;\nconsole.log(`ts ${n}`);\n", "ts 42\n"},
		{"r", "Rscript", "cat(sum(1:3) * 7, \"\\n\")\n", "42 \n"},
		{"go", "go", "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"go\", 6*7) }\n", "go 42\n"},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			if r, err := sb.RunShell(ctx, "command -v "+tc.tool); err != nil || r.Code != 0 {
				t.Skipf("no %s in the sandbox (the host image shows the host's /usr; scripts/install-deps.sh installs it)", tc.tool)
			}
			res, err := sb.RunCode(ctx, tc.lang, tc.code, sbx.RunCodeOptions{Timeout: 2 * time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if string(res.Stdout) != tc.want || res.ExitCode != 0 {
				t.Errorf("got stdout %q exit %d error %q stderr %q, want %q", res.Stdout, res.ExitCode, res.Error, res.Stderr, tc.want)
			}
		})
	}
	t.Run("missing-language", func(t *testing.T) {
		// Some language's toolchain is missing in the sandbox (the host image
		// has /usr/bin but not, say, /usr/local/go/bin on its PATH).
		lang := ""
		for _, l := range []struct{ name, tool string }{{"go", "go"}, {"ruby", "ruby"}, {"r", "Rscript"}, {"java", "javac"}, {"typescript", "tsc"}} {
			if r, err := sb.RunShell(ctx, "command -v "+l.tool); err == nil && r.Code != 0 {
				lang = l.name
				break
			}
		}
		target := sb
		if lang == "" {
			// Every toolchain is here: hide them with a PATH that has none.
			bare, err := d.client().Create(ctx, sbx.CreateOptions{Env: map[string]string{"PATH": "/sbx-no-tools"}})
			if err != nil {
				t.Fatal(err)
			}
			d.remember(bare.ID)
			t.Cleanup(func() { _ = bare.Destroy(context.Background()) })
			target, lang = bare, "ruby"
		}
		_, err := target.RunCode(ctx, lang, "puts 1", sbx.RunCodeOptions{})
		if err == nil || !strings.Contains(err.Error(), "not available in this image") {
			t.Errorf("got %v, want a 'not available in this image' error", err)
		}
		if _, err := sb.RunCode(ctx, "cobol", "x", sbx.RunCodeOptions{}); !sbx.IsInvalidArgument(err) {
			t.Errorf("unknown language: got %v, want InvalidArgument", err)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		res, err := sb.RunCode(ctx, "python", "import time\ntime.sleep(30)\n", sbx.RunCodeOptions{Timeout: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if !res.TimedOut {
			t.Errorf("got %+v, want timed out", res)
		}
	})
	t.Run("cli", func(t *testing.T) {
		out := t.TempDir()
		stdout, stderr, code := d.cli("import os\nprint('from cli')\nopen(os.environ['SBX_OUTPUT_DIR']+'/x.txt','w').write('x')\n",
			"run-code", "--sandbox", sb.ID, "--lang", "python", "--out", out, "-")
		if code != 0 || !strings.Contains(stdout, "from cli") {
			t.Fatalf("sbx run-code: exit %d stdout %q stderr %q", code, stdout, stderr)
		}
		if b, err := os.ReadFile(out + "/x.txt"); err != nil || string(b) != "x" {
			t.Errorf("artifact saved by the CLI: %q, %v", b, err)
		}
	})
}

func TestRunCodePolicy(t *testing.T) {
	_, sb, ctx := codeSandbox(t)
	code := "# os.system('rm -rf /') in a comment\ns = \"import subprocess; os.system('x')\"\nimport subprocess\nprint('ran')\n"
	advisory := &sbxv1.CodePolicy{Presets: []string{"default"}}
	res, err := sb.RunCode(ctx, "python", code, sbx.RunCodeOptions{Policy: advisory})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "ran\n" || len(res.Findings) != 1 || res.Findings[0].GetRule() != "py-subprocess" || res.Findings[0].GetLine() != 3 {
		t.Errorf("advisory: got stdout %q findings %v, want it to run with one py-subprocess finding on line 3", res.Stdout, res.Findings)
	}
	enforce := &sbxv1.CodePolicy{Presets: []string{"default"}, Mode: sbxv1.PolicyMode_POLICY_MODE_ENFORCE}
	_, err = sb.RunCode(ctx, "python", code, sbx.RunCodeOptions{Policy: enforce})
	if err == nil || !strings.Contains(err.Error(), "py-subprocess") || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("enforce: got %v, want a refusal listing py-subprocess on line 3", err)
	}
	// Below the threshold runs.
	res, err = sb.RunCode(ctx, "python", "x = eval('1+1')\nprint(x)\n", sbx.RunCodeOptions{Policy: enforce})
	if err != nil || string(res.Stdout) != "2\n" || len(res.Findings) != 1 {
		t.Errorf("enforce below threshold: got %v, %+v", err, res)
	}
}

func TestRunCodeContexts(t *testing.T) {
	_, sb, ctx := codeSandbox(t)

	t.Run("python", func(t *testing.T) {
		cc, err := sb.CreateContext(ctx, "python", sbx.ContextOptions{})
		if err != nil {
			t.Fatal(err)
		}
		steps := []struct{ code, stdout, value, err string }{
			{code: "import os, json\nx = 20\nos.makedirs('/tmp/ctxdir', exist_ok=True)\nos.chdir('/tmp/ctxdir')\nprint('set')", stdout: "set\n"},
			{code: "x += 1\njson.dumps({'x': x})", value: `'{"x": 21}'`},
			{code: "os.getcwd()", value: "'/tmp/ctxdir'"},
			{code: "print('partial', end='')\nundefined_name", stdout: "partial", err: "NameError: name 'undefined_name' is not defined"},
			{code: "x * 2", value: "42"},
		}
		for i, s := range steps {
			res, err := cc.Run(ctx, s.code, sbx.RunCodeOptions{})
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			var value string
			if res.Value != nil {
				value = res.Value.GetText()
			}
			if string(res.Stdout) != s.stdout || value != s.value || res.Error != s.err {
				t.Errorf("step %d: got stdout %q value %q error %q (stderr %q), want %q %q %q", i, res.Stdout, value, res.Error, res.Stderr, s.stdout, s.value, s.err)
			}
		}
		if hostHas("/usr/bin/python3", "-c", "import matplotlib") {
			res, err := cc.Run(ctx, "import matplotlib.pyplot as plt\nfig = plt.figure()\nplt.plot([1, 2])\nfig", sbx.RunCodeOptions{})
			if err != nil || res.Value == nil || !bytes.HasPrefix(res.Value.GetPng(), []byte("\x89PNG")) {
				t.Errorf("figure as last expression: got %v, %+v", err, res)
			}
			res, err = cc.Run(ctx, "plt.plot([3, 1])\nNone", sbx.RunCodeOptions{})
			if err != nil || len(res.Artifacts) != 1 || res.Artifacts[0].GetMime() != "image/png" {
				t.Errorf("open figure: got %v, %+v", err, res)
			}
		}
		res, err := cc.Run(ctx, "import time\ntime.sleep(30)", sbx.RunCodeOptions{Timeout: 300 * time.Millisecond})
		if err != nil || !res.TimedOut || !strings.Contains(res.Error, "KeyboardInterrupt") {
			t.Errorf("timeout: got %v, %+v", err, res)
		}
		if res, err := cc.Run(ctx, "x", sbx.RunCodeOptions{}); err != nil || res.Value.GetText() != "21" {
			t.Errorf("after a timeout the context keeps its state: got %v, %+v", err, res)
		}
		list, err := sb.Contexts(ctx)
		if err != nil || len(list) != 1 || list[0].ID != cc.ID {
			t.Errorf("list: got %v, %v", list, err)
		}
		if err := cc.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := cc.Run(ctx, "x", sbx.RunCodeOptions{}); !sbx.IsNotFound(err) {
			t.Errorf("closed context: got %v, want NotFound", err)
		}
	})
	t.Run("javascript", func(t *testing.T) {
		cc, err := sb.CreateContext(ctx, "javascript", sbx.ContextOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close(ctx) //nolint:errcheck
		steps := []struct{ code, stdout, value, err string }{
			{code: "const path = require('path'); let n = 40; console.log('hi')", stdout: "hi\n"},
			{code: "n += 2; n", value: "42"},
			{code: "process.chdir('/tmp'); path.join(process.cwd(), 'a')", value: "'/tmp/a'"},
			{code: "process.cwd()", value: "'/tmp'"},
			{code: "nope()", err: "ReferenceError: nope is not defined"},
			{code: "Promise.resolve(n + 1)", value: "43"},
		}
		for i, s := range steps {
			res, err := cc.Run(ctx, s.code, sbx.RunCodeOptions{})
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			var value string
			if res.Value != nil {
				value = res.Value.GetText()
			}
			if string(res.Stdout) != s.stdout || value != s.value || res.Error != s.err {
				t.Errorf("step %d: got stdout %q value %q error %q (stderr %q), want %q %q %q", i, res.Stdout, value, res.Error, res.Stderr, s.stdout, s.value, s.err)
			}
		}
	})
}

// wheel builds a minimal pure-Python wheel of module name at version 1.0.
func wheel(t *testing.T, name, body string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	dist := name + "-1.0.dist-info/"
	files := map[string]string{
		name + "/__init__.py": body,
		dist + "METADATA":     "Metadata-Version: 2.1\nName: " + name + "\nVersion: 1.0\n",
		dist + "WHEEL":        "Wheel-Version: 1.0\nGenerator: sbx-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
	}
	var record strings.Builder
	for p, content := range files {
		w, err := zw.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = w.Write([]byte(content))
		record.WriteString(p + ",,\n")
	}
	record.WriteString(dist + "RECORD,,\n")
	w, _ := zw.Create(dist + "RECORD")
	_, _ = w.Write([]byte(record.String()))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestRunCodeLibraryInstall(t *testing.T) {
	if !hostHas("/usr/bin/python3", "-m", "pip", "--version") {
		t.Skip("host python3 has no pip")
	}
	_, sb, ctx := codeSandbox(t)
	if err := sb.WriteFile(ctx, "/tmp/wheels/sbxdemo-1.0-py3-none-any.whl", wheel(t, "sbxdemo", "def answer():\n    return 42\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := sbx.RunCodeOptions{
		Libraries:     []string{"sbxdemo"},
		LibrarySource: &sbxv1.LibrarySource{FindLinks: []string{"/tmp/wheels"}},
		Timeout:       2 * time.Minute,
	}
	// A context started before the install sees the library too.
	cc, err := sb.CreateContext(ctx, "python", sbx.ContextOptions{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := sb.RunCode(ctx, "python", "import sbxdemo\nprint(sbxdemo.answer())\n", opts)
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "42\n" || len(res.Installed) != 1 || res.Installed[0] != "sbxdemo-1.0" {
		t.Errorf("got stdout %q installed %v error %q stderr %q, want 42 and [sbxdemo-1.0]", res.Stdout, res.Installed, res.Error, res.Stderr)
	}
	if res, err := cc.Run(ctx, "import sbxdemo\nsbxdemo.answer()", sbx.RunCodeOptions{}); err != nil || res.Value.GetText() != "42" {
		t.Errorf("context after install: got %v, %+v", err, res)
	}
	res, err = sb.RunCode(ctx, "python", "print(1)", sbx.RunCodeOptions{Libraries: []string{"not-there"}, LibrarySource: opts.LibrarySource})
	if err != nil || res.Error == "" || !strings.Contains(res.Error, "not-there") {
		t.Errorf("missing library: got %v, %+v, want an install error", err, res)
	}
}

// TestRunCodeLibrariesFromRegistries installs libraries from the real npm
// registry and Go module proxy (package registries, the only outside
// hosts tests talk to) through a public-mode sandbox network. It runs when
// SBX_TEST_NETWORK_BUILD=1 (CI sets it). pip is proven against a local wheel
// directory in TestRunCodeLibraryInstall (PyPI is not reachable from here).
func TestRunCodeLibrariesFromRegistries(t *testing.T) {
	if os.Getenv("SBX_TEST_NETWORK_BUILD") != "1" {
		t.Skip("set SBX_TEST_NETWORK_BUILD=1 to install from npm and the Go module proxy")
	}
	// Registered first so it runs after the daemon has stopped.
	t.Cleanup(func() { removeNetworking("sbxlib0", "sbxlib") })
	d := startDaemon(t, "--network=true", "--net-bridge", "sbxlib0", "--net-subnet", "10.218.0.0/16", "--net-table", "sbxlib", "--net-pool", "0")
	if !hasNetwork(t, d) {
		t.Fatal("the daemon started with --network=true does not report the network capability")
	}
	ctx := ctxT(t, 10*time.Minute)
	sb, err := d.client().Create(ctx, sbx.CreateOptions{MemoryBytes: 1 << 30, Network: &sbx.NetworkPolicy{Mode: "public"}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	for _, tc := range []struct {
		lang, tool, lib, code, want string
	}{
		{"javascript", "npm", "is-odd@3.0.1", "const isOdd = require('is-odd');\nconsole.log(isOdd(3), isOdd(4));\n", "true false\n"},
		{"go", "go", "github.com/google/go-cmp@v0.6.0",
			"package main\n\nimport (\n\t\"fmt\"\n\n\t\"github.com/google/go-cmp/cmp\"\n)\n\nfunc main() { fmt.Println(cmp.Equal([]int{1, 2}, []int{1, 2})) }\n", "true\n"},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			if r, err := sb.RunShell(ctx, "command -v "+tc.tool); err != nil || r.Code != 0 {
				t.Skipf("no %s in the sandbox", tc.tool)
			}
			res, err := sb.RunCode(ctx, tc.lang, tc.code, sbx.RunCodeOptions{Libraries: []string{tc.lib}, Timeout: 5 * time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if string(res.Stdout) != tc.want || res.ExitCode != 0 || len(res.Installed) == 0 {
				t.Errorf("got stdout %q exit %d installed %v error %q stderr %q, want %q and the library reported installed",
					res.Stdout, res.ExitCode, res.Installed, res.Error, tail(string(res.Stderr), 10), tc.want)
			}
		})
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	d.assertNoLeaks()
}

// TestRunCodeRubyGemFromLocalSource: gem installs from a local gem source
// (rubygems.org is not reachable from here), built in the sandbox with gem
// build and gem generate_index, given as the library source's index URL.
func TestRunCodeRubyGemFromLocalSource(t *testing.T) {
	_, sb, ctx := codeSandbox(t)
	if r, err := sb.RunShell(ctx, "command -v gem"); err != nil || r.Code != 0 {
		t.Skip("no ruby/gem in the sandbox (scripts/install-deps.sh installs ruby)")
	}
	files := map[string]string{
		"/tmp/gemsrc/sbxgem.gemspec": `Gem::Specification.new do |s|
  s.name = "sbxgem"
  s.version = "1.0.0"
  s.summary = "sbx test gem"
  s.authors = ["sbx"]
  s.files = ["lib/sbxgem.rb"]
  s.license = "MIT"
end
`,
		"/tmp/gemsrc/lib/sbxgem.rb": "module Sbxgem\n  def self.answer\n    42\n  end\nend\n",
	}
	for p, content := range files {
		if err := sb.WriteFile(ctx, p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mustRun(t, ctx, sb, "cd /tmp/gemsrc && gem build sbxgem.gemspec >/dev/null 2>&1 && mkdir -p /tmp/gemrepo/gems && cp sbxgem-1.0.0.gem /tmp/gemrepo/gems/ && gem generate_index -d /tmp/gemrepo >/dev/null 2>&1; ls /tmp/gemrepo/specs.4.8.gz")
	res, err := sb.RunCode(ctx, "ruby", "require 'sbxgem'\nputs Sbxgem.answer\n", sbx.RunCodeOptions{
		Libraries: []string{"sbxgem"}, LibrarySource: &sbxv1.LibrarySource{IndexUrl: "file:///tmp/gemrepo"}, Timeout: 2 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "42\n" || res.ExitCode != 0 || len(res.Installed) != 1 {
		t.Errorf("got stdout %q exit %d installed %v error %q stderr %q, want 42 and sbxgem installed", res.Stdout, res.ExitCode, res.Installed, res.Error, res.Stderr)
	}
}

// TestRunCodeRPackageFromLocalRepo: install.packages from a local CRAN-like
// repository (CRAN is not reachable from here), built in the sandbox with
// R CMD build and tools::write_PACKAGES.
func TestRunCodeRPackageFromLocalRepo(t *testing.T) {
	_, sb, ctx := codeSandbox(t)
	if r, err := sb.RunShell(ctx, "command -v Rscript"); err != nil || r.Code != 0 {
		t.Skip("no R in the sandbox (scripts/install-deps.sh installs r-base-core)")
	}
	files := map[string]string{
		"/tmp/rsrc/sbxr/DESCRIPTION": "Package: sbxr\nVersion: 1.0\nTitle: sbx test package\nDescription: A test.\nAuthor: sbx\nMaintainer: sbx <sbx@example.com>\nLicense: MIT\n",
		"/tmp/rsrc/sbxr/NAMESPACE":   "export(answer)\n",
		"/tmp/rsrc/sbxr/R/answer.R":  "answer <- function() 42\n",
	}
	for p, content := range files {
		if err := sb.WriteFile(ctx, p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mustRun(t, ctx, sb, `cd /tmp/rsrc && R CMD build --no-build-vignettes --no-manual sbxr >/dev/null 2>&1 && mkdir -p /tmp/rrepo/src/contrib && cp sbxr_1.0.tar.gz /tmp/rrepo/src/contrib/ && Rscript -e 'tools::write_PACKAGES("/tmp/rrepo/src/contrib", type="source")' && ls /tmp/rrepo/src/contrib/PACKAGES`)
	res, err := sb.RunCode(ctx, "r", "library(sbxr)\ncat(answer(), \"\\n\")\n", sbx.RunCodeOptions{
		Libraries: []string{"sbxr"}, LibrarySource: &sbxv1.LibrarySource{IndexUrl: "file:///tmp/rrepo"}, Timeout: 2 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "42 \n" || res.ExitCode != 0 || len(res.Installed) != 1 {
		t.Errorf("got stdout %q exit %d installed %v error %q stderr %q, want 42 and sbxr installed", res.Stdout, res.ExitCode, res.Installed, res.Error, res.Stderr)
	}
	// install.packages only warns about a package it cannot install: that is still a failed install.
	res, err = sb.RunCode(ctx, "r", "cat(1)\n", sbx.RunCodeOptions{
		Libraries: []string{"sbxnosuch"}, LibrarySource: &sbxv1.LibrarySource{IndexUrl: "file:///tmp/rrepo"}, Timeout: 2 * time.Minute,
	})
	if err != nil || len(res.Installed) != 0 || !strings.Contains(res.Error, "failed to install: sbxnosuch") || len(res.Stdout) != 0 {
		t.Errorf("missing R package: got %v, installed %v error %q stdout %q, want a failed install naming sbxnosuch", err, res.Installed, res.Error, res.Stdout)
	}
}
