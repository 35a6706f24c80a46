package cli

import (
	"strings"
	"testing"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

func TestPrintTenant(t *testing.T) {
	var b strings.Builder
	err := printTenant(&b, &sbxv1.Tenant{
		Name:   "acme",
		Quotas: &sbxv1.TenantQuotas{MaxSandboxes: 20, MemoryBytes: 16 << 30, CpuMillis: 8000, StorageBytes: 50 << 30},
		Usage: &sbxv1.TenantUsage{Sandboxes: 3, MemoryBytes: 1536 << 20, CpuMillis: 3000, DiskBytes: 3 << 30,
			StorageBytes: 2<<30 + 212<<20, ImagesBytes: 2 << 30, VolumesBytes: 200 << 20, CodebasesBytes: 12 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `tenant: acme
             USED    QUOTA
sandboxes    3       20
memory       1.5GiB  16GiB
cpu          3000m   8000m
disk         3GiB    unlimited
storage      2.2GiB  50GiB
  images     2GiB
  volumes    200MiB
  codebases  12MiB
`
	if got := b.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}
