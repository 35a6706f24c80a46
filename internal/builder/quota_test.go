package builder

import (
	"testing"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/sandbox"
	"github.com/sbxdev/sbx/internal/tenant"
)

func TestWithinQuota(t *testing.T) {
	r := &sbxv1.Resources{MemoryBytes: 4 << 30, CpuMillis: 8000, Pids: 4096, DiskBytes: sandbox.MaxDiskInMemory(4 << 30)}
	for _, tc := range []struct {
		name string
		q    tenant.Quotas
		want *sbxv1.Resources
	}{
		{"no quotas", tenant.Quotas{}, r},
		{"memory", tenant.Quotas{MemoryBytes: 1 << 30}, &sbxv1.Resources{MemoryBytes: 1 << 30, CpuMillis: 8000, Pids: 4096, DiskBytes: sandbox.MaxDiskInMemory(1 << 30)}},
		{"cpu and disk", tenant.Quotas{CPUMillis: 1500, DiskBytes: 64 << 20}, &sbxv1.Resources{MemoryBytes: 4 << 30, CpuMillis: 1500, Pids: 4096, DiskBytes: 64 << 20}},
	} {
		got := withinQuota(r, tc.q)
		if got.GetMemoryBytes() != tc.want.GetMemoryBytes() || got.GetCpuMillis() != tc.want.GetCpuMillis() ||
			got.GetPids() != tc.want.GetPids() || got.GetDiskBytes() != tc.want.GetDiskBytes() {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
	if r.GetMemoryBytes() != 4<<30 {
		t.Errorf("withinQuota changed the builder's own resources: %v", r)
	}
}
