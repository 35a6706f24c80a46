package tenant

import (
	"fmt"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// Usage is what a tenant's sandboxes hold.
type Usage struct {
	Sandboxes   int
	MemoryBytes int64
	CPUMillis   int64
	DiskBytes   int64
}

// Add returns u plus o.
func (u Usage) Add(o Usage) Usage {
	return Usage{u.Sandboxes + o.Sandboxes, u.MemoryBytes + o.MemoryBytes, u.CPUMillis + o.CPUMillis, u.DiskBytes + o.DiskBytes}
}

// Admit returns an error wrapping errdefs.ErrResourceExhausted, naming
// the quota, if holding used plus add would exceed q.
func (q Quotas) Admit(tenant string, used, add Usage) error {
	next := used.Add(add)
	check := []struct {
		name       string
		limit, got int64
	}{
		{"max_sandboxes", int64(q.MaxSandboxes), int64(next.Sandboxes)},
		{"memory_bytes", q.MemoryBytes, next.MemoryBytes},
		{"cpu_millis", q.CPUMillis, next.CPUMillis},
		{"disk_bytes", q.DiskBytes, next.DiskBytes},
	}
	for _, c := range check {
		if c.limit > 0 && c.got > c.limit {
			return fmt.Errorf("tenant %q quota %s: %d would be in use, the quota is %d: %w", tenant, c.name, c.got, c.limit, errdefs.ErrResourceExhausted)
		}
	}
	return nil
}

// AdmitStorage checks the storage_bytes quota for used plus add bytes.
func (q Quotas) AdmitStorage(tenant string, used, add int64) error {
	if q.StorageBytes > 0 && used+add > q.StorageBytes {
		return fmt.Errorf("tenant %q quota storage_bytes: %d bytes would be in use, the quota is %d: %w", tenant, used+add, q.StorageBytes, errdefs.ErrResourceExhausted)
	}
	return nil
}
