package integration

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// writeRecipe writes a recipe (with ./app/hello.txt next to it) and
// returns its path.
func writeRecipe(t *testing.T, dir, from, lastStep string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "app"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "app", "hello.txt"), []byte("hello from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	y := "from: " + from + `
steps:
  - run: echo built > /srv/built.txt; echo to-stderr >&2
  - copy: {src: ./app, dest: /app}
  - env: {GREETING: hello}
  - workdir: /app
  - ` + lastStep + "\n"
	p := filepath.Join(dir, "recipe.yaml")
	if err := os.WriteFile(p, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func countLines(s, substr string) int {
	n := 0
	for line := range strings.SplitSeq(s, "\n") {
		if strings.Contains(line, substr) {
			n++
		}
	}
	return n
}

func TestBuild(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 5*time.Minute)
	c := d.client()
	ref := pushTestImage(t, ctx, d, "test/tools:1", toolImage(t))
	dir := t.TempDir()
	recipe := writeRecipe(t, dir, ref, "run: cat hello.txt > /srv/copied; echo last-step-ran")

	out, errOut, code := d.cli("", "build", "-f", recipe, "-t", "local/built:1")
	if code != 0 {
		t.Fatalf("sbx build: exit %d\n%s", code, errOut)
	}
	if !strings.HasPrefix(out, "index.docker.io/local/built:1 sha256:") {
		t.Errorf("build output %q", out)
	}
	for _, want := range []string{"[1/5] RUN echo built", "      to-stderr\n", "[2/5] COPY", "[5/5] done in", "      last-step-ran\n"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("build progress lacks %q:\n%s", want, errOut)
		}
	}
	digest := strings.Fields(out)[1]

	sb, err := c.Create(ctx, sbx.CreateOptions{Image: "local/built:1"})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	got := mustRun(t, ctx, sb, `cat /srv/built.txt /app/hello.txt /srv/copied; echo "$GREETING $(pwd)"`)
	if want := "built\nhello from the host\nhello from the host\nhello /app\n"; got != want {
		t.Errorf("in the built image: got %q, want %q", got, want)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}

	// Unchanged: every step cached, same image, fast.
	start := time.Now()
	out, errOut, code = d.cli("", "build", "-f", recipe, "-t", "local/built:1")
	took := time.Since(start)
	if code != 0 || countLines(errOut, "CACHED") != 5 || !strings.Contains(out, digest) {
		t.Errorf("unchanged rebuild: exit %d, %d cached, out %q (want digest %s)\n%s", code, countLines(errOut, "CACHED"), out, digest, errOut)
	}
	if took > time.Second {
		t.Errorf("unchanged rebuild took %v (CLI included); want well under a second", took)
	}

	// Only the last step changes: only it runs.
	recipe = writeRecipe(t, dir, ref, "run: echo changed > /srv/last")
	_, errOut, code = d.cli("", "build", "-f", recipe, "-t", "local/built:2")
	if code != 0 || countLines(errOut, "CACHED") != 4 || !strings.Contains(errOut, "[5/5] RUN echo changed") {
		t.Errorf("last step changed: exit %d\n%s", code, errOut)
	}

	// --no-cache reruns everything.
	_, errOut, code = d.cli("", "build", "-f", recipe, "-t", "local/built:3", "--no-cache")
	if code != 0 || countLines(errOut, "CACHED") != 0 || countLines(errOut, "done in") != 5 {
		t.Errorf("--no-cache: exit %d\n%s", code, errOut)
	}

	// A failing step: a clear error with the exit code, no sandbox left.
	recipe = writeRecipe(t, dir, ref, "run: echo about to fail; exit 3")
	_, errOut, code = d.cli("", "build", "-f", recipe, "-t", "local/broken:1")
	if code == 0 || !strings.Contains(errOut, "step 5 (RUN echo about to fail; exit 3) failed with exit code 3") {
		t.Errorf("failing step: exit %d\n%s", code, errOut)
	}
	if list, err := c.List(ctx, "sbx.build"); err != nil || len(list) != 0 {
		t.Errorf("build sandboxes left: %d, %v", len(list), err)
	}
	if out, _, _ := d.cli("", "images", "ls"); strings.Contains(out, "local/broken") || strings.Count(out, "\n") != 7 {
		t.Errorf("images after the builds (want the pulled one, built:1..3, no intermediates):\n%s", out)
	}

	// Package steps need sandbox networking; without it they fail fast.
	if !hasNetwork(t, d) {
		r := &sbxv1.Recipe{From: ref, Steps: []*sbxv1.RecipeStep{
			{Step: &sbxv1.RecipeStep_AptInstall{AptInstall: &sbxv1.PackageList{Packages: []string{"python3"}}}}}}
		_, err := c.Images().Build(ctx, r, "local/apt:1", false, nil)
		if err == nil || !strings.Contains(err.Error(), "step 1 (apt_install): sandbox networking is not available yet") {
			t.Errorf("apt step without networking: %v", err)
		}
	}

	// A figure: a cached rebuild against the cheapest image call.
	r := &sbxv1.Recipe{From: ref, Steps: []*sbxv1.RecipeStep{
		{Step: &sbxv1.RecipeStep_Run{Run: "echo built > /srv/built.txt; echo to-stderr >&2"}},
		{Step: &sbxv1.RecipeStep_Env{Env: &sbxv1.EnvStep{Env: map[string]string{"GREETING": "hello"}}}},
		{Step: &sbxv1.RecipeStep_Workdir{Workdir: "/app"}},
	}}
	if _, err := c.Images().Build(ctx, r, "local/bench:1", false, nil); err != nil {
		t.Fatal(err)
	}
	median := func(f func() error) time.Duration {
		var ds []time.Duration
		for range 15 {
			t0 := time.Now()
			if err := f(); err != nil {
				t.Fatal(err)
			}
			ds = append(ds, time.Since(t0))
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	build := median(func() error { _, err := c.Images().Build(ctx, r, "local/bench:1", false, nil); return err })
	list := median(func() error { _, _, err := c.Images().List(ctx); return err })
	t.Logf("cached rebuild of 3 steps: %v median; images ls round trip: %v median", build, list)
	if build > 250*time.Millisecond {
		t.Errorf("cached rebuild takes %v; want well under a second", build)
	}
	d.assertNoLeaks()
}

// hasNetwork reports whether d's default runtime gives sandboxes a network.
func hasNetwork(t *testing.T, d *daemon) bool {
	t.Helper()
	v, err := d.client().Version(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, rt := range v.GetRuntimes() {
		if rt.GetIsDefault() {
			return slices.Contains(rt.GetCapabilities(), "network")
		}
	}
	return false
}

// TestBuildDebianBase makes debian:bookworm with debootstrap from the
// host's apt mirror (about 30s and a download): only with
// SBX_TEST_DEBOOTSTRAP=1.
func TestBuildDebianBase(t *testing.T) {
	if os.Getenv("SBX_TEST_DEBOOTSTRAP") != "1" {
		t.Skip("set SBX_TEST_DEBOOTSTRAP=1 to run debootstrap (about 30s, downloads from the host's Debian mirror)")
	}
	d := startDaemon(t)
	ctx := ctxT(t, 10*time.Minute)
	c := d.client()
	r := &sbxv1.Recipe{From: "debian:bookworm", Steps: []*sbxv1.RecipeStep{
		{Step: &sbxv1.RecipeStep_Run{Run: "echo made-in-debian > /etc/sbx-test"}}}}
	t0 := time.Now()
	img, err := c.Images().Build(ctx, r, "local/deb:1", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("debian base + one step: %v, %d layers, %d MB", time.Since(t0).Round(time.Second), img.GetLayers(), img.GetSizeBytes()>>20)
	base, err := c.Images().Get(ctx, "debian:bookworm")
	if err != nil || base.GetLayers() != 1 {
		t.Fatalf("debian:bookworm: %v, %v", base, err)
	}
	sb, err := c.Create(ctx, sbx.CreateOptions{Image: "local/deb:1"})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	got := mustRun(t, ctx, sb, `. /etc/os-release; echo "$VERSION_CODENAME"; cat /etc/sbx-test; dpkg -s apt | grep -c '^Status: install ok installed'; ls /var/lib/apt/lists | grep -vc partial || true; id -u`)
	if want := "bookworm\nmade-in-debian\n1\n0\n0\n"; got != want {
		t.Errorf("in debian: got %q, want %q", got, want)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	// The base is cached: a second build does not debootstrap again, and
	// every step comes from the cache.
	var events []string
	if _, err := c.Images().Build(ctx, r, "local/deb:1", false, func(ev *sbxv1.ImageProgress) {
		switch {
		case ev.GetStep() != nil:
			events = append(events, ev.GetStep().GetPhase())
		case ev.GetStatus() != "":
			events = append(events, ev.GetStatus())
		}
	}); err != nil {
		t.Fatalf("second build: %v", err)
	}
	for _, e := range events {
		if e != "cached" && (strings.Contains(e, "debootstrap") || e == "running" || e == "done") {
			t.Errorf("second build: event %q (all: %q), want the base and every step cached", e, events)
		}
	}
	d.assertNoLeaks()
}

// TestBuildPythonRecipe builds examples/recipes/python.yaml: it needs
// sandbox networking (apt) and SBX_TEST_DEBOOTSTRAP=1 (the debian base).
func TestBuildPythonRecipe(t *testing.T) {
	if os.Getenv("SBX_TEST_DEBOOTSTRAP") != "1" {
		t.Skip("set SBX_TEST_DEBOOTSTRAP=1 to build on debian:bookworm (debootstrap, downloads)")
	}
	// Registered first so it runs after the daemon has stopped.
	t.Cleanup(func() { removeNetworking("sbxpy0", "sbxpy") })
	d := startDaemon(t, "--network=true", "--net-bridge", "sbxpy0", "--net-subnet", "10.217.0.0/16", "--net-table", "sbxpy", "--net-pool", "0")
	if !hasNetwork(t, d) {
		t.Fatal("the daemon started with --network=true does not report the network capability")
	}
	ctx := ctxT(t, 20*time.Minute)
	out, errOut, code := d.cli("", "build", "-f", "../examples/recipes/python.yaml", "-t", "local/python:1")
	if code != 0 {
		t.Fatalf("build python.yaml: exit %d\n%s", code, errOut)
	}
	t.Log(out)
	sb, err := d.client().Create(ctx, sbx.CreateOptions{Image: "local/python:1"})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	got := mustRun(t, ctx, sb, `python3 -c 'import numpy, pandas, matplotlib; print(int(numpy.arange(4).sum()))'`)
	if got != "6\n" {
		t.Errorf("python in the built image: %q", got)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	d.assertNoLeaks()
}

// TestBuildAptRecipe builds on debian:bookworm (debootstrap) with an
// apt_install step that reaches Debian's mirror through the sandbox network
// — a package registry, the only outside traffic tests make. It runs when
// SBX_TEST_NETWORK_BUILD=1 (CI sets it): about a minute and a download.
func TestBuildAptRecipe(t *testing.T) {
	if os.Getenv("SBX_TEST_NETWORK_BUILD") != "1" {
		t.Skip("set SBX_TEST_NETWORK_BUILD=1 to build with apt from Debian's mirror (debootstrap + download)")
	}
	// Registered first so it runs after the daemon has stopped.
	t.Cleanup(func() { removeNetworking("sbxbld0", "sbxbld") })
	d := startDaemon(t, "--network=true", "--net-bridge", "sbxbld0", "--net-subnet", "10.216.0.0/16", "--net-table", "sbxbld", "--net-pool", "0")
	if !hasNetwork(t, d) {
		t.Fatal("the daemon started with --network=true does not report the network capability")
	}
	ctx := ctxT(t, 15*time.Minute)
	// pip_install is proven against a local wheel directory copied into the
	// image (PyPI is not reachable from our machines).
	var wheels bytes.Buffer
	tw := tar.NewWriter(&wheels)
	whl := wheel(t, "sbxdemo", "def answer():\n    return 42\n")
	if err := tw.WriteHeader(&tar.Header{Name: "sbxdemo-1.0-py3-none-any.whl", Mode: 0o644, Size: int64(len(whl)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	_, _ = tw.Write(whl)
	_ = tw.Close()
	r := &sbxv1.Recipe{From: "debian:bookworm", Steps: []*sbxv1.RecipeStep{
		{Step: &sbxv1.RecipeStep_AptInstall{AptInstall: &sbxv1.PackageList{Packages: []string{"jq", "python3-pip"}}}},
		{Step: &sbxv1.RecipeStep_Env{Env: &sbxv1.EnvStep{Env: map[string]string{"BUILT": "yes", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/wheels"}}}},
		{Step: &sbxv1.RecipeStep_Copy{Copy: &sbxv1.CopyStep{Dest: "/wheels", Tar: wheels.Bytes()}}},
		{Step: &sbxv1.RecipeStep_PipInstall{PipInstall: &sbxv1.PackageList{Packages: []string{"sbxdemo==1.0"}}}},
	}}
	t0 := time.Now()
	if _, err := d.client().Images().Build(ctx, r, "local/jq:1", false, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("debian base + apt install jq python3-pip + pip install: %v", time.Since(t0).Round(time.Second))
	sb, err := d.client().Create(ctx, sbx.CreateOptions{Image: "local/jq:1", Network: &sbx.NetworkPolicy{Mode: "none"}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	if got := mustRun(t, ctx, sb, `echo '{"a": [1, 2]}' | jq -c '.a | add'; echo $BUILT; python3 -c 'import sbxdemo; print(sbxdemo.answer())'`); got != "3\nyes\n42\n" {
		t.Errorf("jq, env and the pip-installed module in the built image: %q", got)
	}
	// Unchanged recipe: every step cached (how fast is measured by make bench, not here).
	var phases []string
	if _, err := d.client().Images().Build(ctx, r, "local/jq:1", false, func(ev *sbxv1.ImageProgress) {
		if st := ev.GetStep(); st != nil {
			phases = append(phases, st.GetPhase())
		}
	}); err != nil {
		t.Fatal(err)
	}
	if len(phases) != len(r.Steps) || slices.ContainsFunc(phases, func(p string) bool { return p != "cached" }) {
		t.Errorf("rebuild of an unchanged recipe: step phases %v, want all cached", phases)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}

	// apt stays usable after an apt step: a later run step installs
	// without an update (the lists used to be deleted). And the python
	// step installs the version Debian has, and names what it has when
	// asked for one it lacks.
	r.Steps = append(r.Steps,
		&sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Run{Run: "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends tree"}},
		&sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Python{Python: "3.11"}})
	if _, err := d.client().Images().Build(ctx, r, "local/jq:2", false, nil); err != nil {
		t.Fatalf("apt-get install in a run step after an apt step: %v", err)
	}
	sb, err = d.client().Create(ctx, sbx.CreateOptions{Image: "local/jq:2", Network: &sbx.NetworkPolicy{Mode: "none"}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	if got := mustRun(t, ctx, sb, `tree --version >/dev/null && echo tree; python --version; python3 -c 'import venv; print("venv")'`); got != "tree\nPython 3.11.2\nvenv\n" {
		t.Errorf("tree and python 3.11 in the built image: got %q", got)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	bad := &sbxv1.Recipe{From: "debian:bookworm", Steps: []*sbxv1.RecipeStep{{Step: &sbxv1.RecipeStep_Python{Python: "3.99"}}}}
	var logs strings.Builder
	_, err = d.client().Images().Build(ctx, bad, "", false, func(ev *sbxv1.ImageProgress) { logs.Write(ev.GetLog()) })
	if err == nil || !strings.Contains(err.Error(), "step 1 (PYTHON 3.99) failed with exit code 3") ||
		!strings.Contains(logs.String(), "python 3.99 is not packaged by this image's apt sources; they have: python3.11") {
		t.Errorf("python 3.99: got %v, log %q; want the step's failure and the versions the sources have", err, logs.String())
	}
	d.assertNoLeaks()
}
