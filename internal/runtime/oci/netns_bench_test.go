//go:build linux

package oci_test

import (
	"context"
	"os/exec"
	"testing"

	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/testsuite"
	"github.com/sbxdev/sbx/internal/testutil"
)

// BenchmarkCreateReadyNetNS is BenchmarkCreateReady joining a host-owned
// network namespace (as boxes with networking do).
func BenchmarkCreateReadyNetNS(b *testing.B) {
	testutil.RequiresRoot(b)
	name := "sbxbench-oci"
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		b.Skipf("ip netns add: %v %s", err, out)
	}
	b.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	d := newDriver(b, stateRoot(b))
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		spec := testsuite.NewSpec("bench")
		spec.Network = &runtime.Network{NetNS: &runtime.NetNS{Path: "/run/netns/" + name}}
		h, err := d.Create(ctx, spec)
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
