package sandbox

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/tenant"
)

func (s *memShared) Reserve(_ context.Context, tenantName, id string, u tenant.Usage, check func(tenant.Usage) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var others tenant.Usage
	for o, ou := range s.ledger[tenantName] {
		if o != id {
			others = others.Add(ou)
		}
	}
	if err := check(others); err != nil {
		return err
	}
	if s.ledger == nil {
		s.ledger = map[string]map[string]tenant.Usage{}
	}
	if s.ledger[tenantName] == nil {
		s.ledger[tenantName] = map[string]tenant.Usage{}
	}
	s.ledger[tenantName][id] = u
	return nil
}

func (s *memShared) Unreserve(_ context.Context, tenantName, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.ledger[tenantName], id)
	return nil
}

func (s *memShared) ReconcileUsage(context.Context, map[string]map[string]tenant.Usage, time.Duration) error {
	return nil // the memory ledger never misses a write
}

// TestReplicaQuotaAcrossReplicas: creates for one tenant racing through
// two replicas admit exactly the tenant's max_sandboxes, not that many per
// replica; a destroy through one replica frees room for a create through
// the other at once (no sweep, no teardown in between).
func TestReplicaQuotaAcrossReplicas(t *testing.T) {
	const quota, creates = 3, 10
	for name, mk := range sharedBackends(t) {
		t.Run(name, func(t *testing.T) {
			r := newReplicas(t, mk(t), 2)
			ctx := tenant.WithPrincipal(context.Background(), tenant.Principal{Tenant: "acme", Quotas: tenant.Quotas{MaxSandboxes: quota}})
			var (
				wg      sync.WaitGroup
				mu      sync.Mutex
				made    []string
				refused int
				others  []error
			)
			start := make(chan struct{})
			for i := range creates {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					sb, err := r.mgrs[i%2].Create(ctx, &sbxv1.CreateSandboxRequest{})
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						made = append(made, sb.Id)
					case errors.Is(err, errdefs.ErrResourceExhausted):
						refused++
					default:
						others = append(others, err)
					}
				}()
			}
			close(start)
			wg.Wait()
			if len(made) != quota || refused != creates-quota || len(others) > 0 {
				t.Fatalf("%d creates over 2 replicas with max_sandboxes %d: %d made, %d refused, other errors %v; want %d made, %d refused",
					creates, quota, len(made), refused, others, quota, creates-quota)
			}
			// At the quota through either replica.
			for i, m := range r.mgrs {
				if _, err := m.Create(ctx, &sbxv1.CreateSandboxRequest{}); !errors.Is(err, errdefs.ErrResourceExhausted) {
					t.Errorf("create through replica %d at the quota: got %v, want resource exhausted", i, err)
				}
			}
			if err := r.mgrs[1].Destroy(ctx, made[0]); err != nil {
				t.Fatalf("destroy through B: %v", err)
			}
			// A destroyed box counts no more, before its teardown ends.
			if _, err := r.mgrs[0].Create(ctx, &sbxv1.CreateSandboxRequest{}); err != nil {
				t.Errorf("create through A after a destroy through B: %v", err)
			}
		})
	}
}

// TestReplicaLimitQuotaAcrossReplicas: growing two sandboxes' memory
// through two replicas counts both growths against the tenant's memory
// quota, though neither replica's memory has seen the other's yet.
func TestReplicaLimitQuotaAcrossReplicas(t *testing.T) {
	for name, mk := range sharedBackends(t) {
		t.Run(name, func(t *testing.T) {
			r := newReplicas(t, mk(t), 2)
			a, b := r.mgrs[0], r.mgrs[1]
			ctx := tenant.WithPrincipal(context.Background(), tenant.Principal{Tenant: "acme", Quotas: tenant.Quotas{MemoryBytes: 200 << 20}})
			res := &sbxv1.Resources{MemoryBytes: 64 << 20}
			one, err := a.Create(ctx, &sbxv1.CreateSandboxRequest{Resources: res})
			if err != nil {
				t.Fatal(err)
			}
			two, err := b.Create(ctx, &sbxv1.CreateSandboxRequest{Resources: res})
			if err != nil {
				t.Fatal(err)
			}
			// 128 MiB in use of 200: one may grow by 64, then two may not.
			if _, err := a.Update(ctx, &sbxv1.UpdateSandboxRequest{Sandbox: one.Id, Resources: &sbxv1.Resources{MemoryBytes: 128 << 20}}); err != nil {
				t.Fatalf("growing %s through A to 128 MiB: %v", one.Id, err)
			}
			_, err = b.Update(ctx, &sbxv1.UpdateSandboxRequest{Sandbox: two.Id, Resources: &sbxv1.Resources{MemoryBytes: 128 << 20}})
			if !errors.Is(err, errdefs.ErrResourceExhausted) {
				t.Fatalf("growing %s through B to 128 MiB with 192 of 200 MiB in use: got %v, want resource exhausted", two.Id, err)
			}
			// Shrinking through A makes room for B at once.
			if _, err := a.Update(ctx, &sbxv1.UpdateSandboxRequest{Sandbox: one.Id, Resources: &sbxv1.Resources{MemoryBytes: 64 << 20}}); err != nil {
				t.Fatalf("shrinking %s through A: %v", one.Id, err)
			}
			if _, err := b.Update(ctx, &sbxv1.UpdateSandboxRequest{Sandbox: two.Id, Resources: &sbxv1.Resources{MemoryBytes: 128 << 20}}); err != nil {
				t.Errorf("growing %s through B after A shrank %s: %v", two.Id, one.Id, err)
			}
		})
	}
}

// TestReplicaSeesUnadopted: a replica asked whether a tenant sees a box
// another replica just made (codeexec asks it of a session's sandbox)
// looks in the store instead of answering from its memory, which has not
// adopted the box yet; another tenant still does not see it.
func TestReplicaSeesUnadopted(t *testing.T) {
	for name, mk := range sharedBackends(t) {
		t.Run(name, func(t *testing.T) {
			r := newReplicas(t, mk(t), 2)
			acme := tenant.WithPrincipal(context.Background(), tenant.Principal{Tenant: "acme"})
			other := tenant.WithPrincipal(context.Background(), tenant.Principal{Tenant: "other"})
			sb, err := r.mgrs[0].Create(acme, &sbxv1.CreateSandboxRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if !r.mgrs[1].Sees(acme, sb.Id) {
				t.Errorf("B: acme does not see its own %s made through A, want it seen", sb.Id)
			}
			if r.mgrs[1].Sees(other, sb.Id) {
				t.Errorf("B: tenant other sees acme's %s, want not", sb.Id)
			}
			two, err := r.mgrs[0].Create(acme, &sbxv1.CreateSandboxRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if r.mgrs[1].Sees(other, two.Id) {
				t.Errorf("B: tenant other sees acme's unadopted %s, want not", two.Id)
			}
		})
	}
}
