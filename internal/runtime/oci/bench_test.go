//go:build linux

package oci_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sbxdev/sbx/internal/runtime/testsuite"
	"github.com/sbxdev/sbx/internal/testutil"
)

// BenchmarkCreateReady measures Create until the agent answers Hello (the
// box is destroyed outside the timer).
func BenchmarkCreateReady(b *testing.B) {
	testutil.RequiresRoot(b)
	if testing.Verbose() {
		// Each create's phases ("box created" ... phases=...).
		defer slog.SetLogLoggerLevel(slog.SetLogLoggerLevel(slog.LevelDebug))
	}
	d := newDriver(b, stateRoot(b))
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		h, err := d.Create(ctx, testsuite.NewSpec("bench"))
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := d.Destroy(ctx, h); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkDestroy measures Destroy of a running, ready box.
func BenchmarkDestroy(b *testing.B) {
	testutil.RequiresRoot(b)
	d := newDriver(b, stateRoot(b))
	ctx := context.Background()
	durs := make([]time.Duration, 0, b.N)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		h, err := d.Create(ctx, testsuite.NewSpec("bench"))
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		t0 := time.Now()
		if err := d.Destroy(ctx, h); err != nil {
			b.Fatal(err)
		}
		durs = append(durs, time.Since(t0))
	}
	sort.Slice(durs, func(i, j int) bool { return durs[i] < durs[j] })
	b.ReportMetric(float64(durs[len(durs)/2].Microseconds())/1000, "p50-ms")
}

// BenchmarkBaselineRuncRunTrue is the floor of the runtime itself: `runc run`
// (foreground) of /bin/true in a bundle whose rootfs is an empty skeleton with
// the host's /usr bind-mounted read-only (like our host image), new
// pid/mount/ipc/uts/net namespaces, a cgroup, no user namespace, no seccomp.
func BenchmarkBaselineRuncRunTrue(b *testing.B) {
	testutil.RequiresRoot(b)
	runc, err := exec.LookPath("runc")
	if err != nil {
		b.Skip("runc not installed")
	}
	dir := b.TempDir()
	rootfs := filepath.Join(dir, "bundle", "rootfs")
	for _, sub := range []string{"usr", "proc", "dev", "tmp"} {
		if err := os.MkdirAll(filepath.Join(rootfs, sub), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	for _, l := range []string{"bin", "lib", "lib64"} {
		if err := os.Symlink("usr/"+l, filepath.Join(rootfs, l)); err != nil {
			b.Fatal(err)
		}
	}
	spec := &specs.Spec{
		Version: "1.0.2",
		Root:    &specs.Root{Path: "rootfs"},
		Process: &specs.Process{Args: []string{"/bin/true"}, Cwd: "/", Env: []string{"PATH=/usr/bin"}},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/usr", Type: "bind", Source: "/usr", Options: []string{"rbind", "ro"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.MountNamespace},
				{Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.NetworkNamespace}},
			CgroupsPath: "/sbx-bench/true",
		},
	}
	raw, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(dir, "bundle", "config.json"), raw, 0o644); err != nil {
		b.Fatal(err)
	}
	root := filepath.Join(dir, "runc-root")
	b.Cleanup(func() {
		matches, _ := filepath.Glob("/sys/fs/cgroup/*/sbx-bench")
		matches2, _ := filepath.Glob("/sys/fs/cgroup/sbx-bench")
		for _, m := range append(matches, matches2...) {
			os.Remove(m)
		}
	})
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		cmd := exec.Command(runc, "--root", root, "run", "--bundle", filepath.Join(dir, "bundle"), fmt.Sprintf("true-%d", i))
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("runc run: %v: %s", err, out)
		}
	}
}

// BenchmarkBaselineUnshare is the floor of namespace creation: unshare(1) of
// user+pid+mount+net+uts+ipc running /bin/true.
func BenchmarkBaselineUnshare(b *testing.B) {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		b.Skip("unshare not installed")
	}
	for i := 0; i < b.N; i++ {
		cmd := exec.Command(unshare, "--user", "--map-root-user", "--pid", "--fork", "--mount", "--net", "--uts", "--ipc", "/bin/true")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("unshare: %v: %s", err, out)
		}
	}
}
