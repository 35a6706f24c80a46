package codebase

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/tenant"
	"github.com/sbxdev/sbx/internal/testutil"
)

// quotaStorage admits growth up to limit bytes over what the manager's
// codebases of ctx's tenant hold.
type quotaStorage struct {
	m     *Manager
	limit int64
}

func (q *quotaStorage) ReserveStorage(ctx context.Context, add int64) (func(), error) {
	used, err := q.m.Bytes(ctx, tenant.FromContext(ctx).Tenant)
	if err != nil {
		return nil, err
	}
	if used+add > q.limit {
		return nil, fmt.Errorf("quota storage_bytes: %d would be in use, the quota is %d: %w", used+add, q.limit, errdefs.ErrResourceExhausted)
	}
	return func() {}, nil
}

func TestCodebasesPerTenant(t *testing.T) {
	testutil.RequiresRoot(t)
	m, _ := newManager(t)
	acme := tenant.WithPrincipal(context.Background(), tenant.Principal{Tenant: "acme"})
	beta := tenant.WithPrincipal(context.Background(), tenant.Principal{Tenant: "beta"})
	owner := context.Background()
	cb, _, err := m.Create(acme, &sbxv1.CreateCodebaseHeader{Name: "proj"}, bytes.NewReader(tarOf(t, ent{name: "secret.txt", body: "acme's"})))
	if err != nil {
		t.Fatal(err)
	}
	for who, ctx := range map[string]context.Context{"beta": beta, "the owner": owner} {
		for _, ref := range []string{"proj", cb.GetId()} {
			if _, err := m.Get(ctx, ref); !errdefs.IsNotFound(err) {
				t.Errorf("%s gets acme's %s: got %v, want not found", who, ref, err)
			}
			var buf bytes.Buffer
			if err := m.Download(ctx, ref, &buf); !errdefs.IsNotFound(err) || buf.Len() != 0 {
				t.Errorf("%s downloads acme's %s: got %v and %d bytes, want not found and nothing", who, ref, err, buf.Len())
			}
			if err := m.Delete(ctx, ref); !errdefs.IsNotFound(err) {
				t.Errorf("%s deletes acme's %s: got %v, want not found", who, ref, err)
			}
			if _, err := m.Mount(ctx, "sb-"+strings.ReplaceAll(who, " ", ""), &sbxv1.CodebaseMount{Codebase: ref}, 16<<20); !errdefs.IsNotFound(err) {
				t.Errorf("%s mounts acme's %s: got %v, want not found", who, ref, err)
			}
		}
		if list, err := m.List(ctx); err != nil || len(list) != 0 {
			t.Errorf("%s lists: got %v, %v; want nothing", who, list, err)
		}
	}
	// Names are per tenant.
	if _, _, err := m.Create(beta, &sbxv1.CreateCodebaseHeader{Name: "proj"}, bytes.NewReader(tarOf(t, ent{name: "b.txt", body: "b"}))); err != nil {
		t.Errorf("beta's own proj: %v", err)
	}
	if got, err := m.Get(acme, "proj"); err != nil || got.GetId() != cb.GetId() {
		t.Errorf("acme's proj after beta made one: got %v, %v", got, err)
	}
	if list, err := m.List(acme); err != nil || len(list) != 1 || list[0].GetId() != cb.GetId() {
		t.Errorf("acme's list: got %v, %v; want its proj alone", list, err)
	}
	if err := m.Delete(acme, "proj"); err != nil {
		t.Errorf("acme deletes its proj: %v", err)
	}
}

func TestCreateOverStorageQuotaLeavesNothing(t *testing.T) {
	testutil.RequiresRoot(t)
	m, _ := newManager(t)
	m.cfg.Storage = &quotaStorage{m: m, limit: 1000}
	ctx := tenant.WithPrincipal(context.Background(), tenant.Principal{Tenant: "acme"})
	if _, _, err := m.Create(ctx, &sbxv1.CreateCodebaseHeader{Name: "small"}, bytes.NewReader(tarOf(t, ent{name: "a", body: strings.Repeat("a", 600)}))); err != nil {
		t.Fatalf("a create within the quota: %v", err)
	}
	_, _, err := m.Create(ctx, &sbxv1.CreateCodebaseHeader{Name: "big"}, bytes.NewReader(tarOf(t, ent{name: "b", body: strings.Repeat("b", 600)})))
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "storage_bytes") {
		t.Fatalf("a create over the quota: got %v, want ResourceExhausted naming storage_bytes", err)
	}
	if _, err := m.Get(ctx, "big"); !errdefs.IsNotFound(err) {
		t.Errorf("the refused codebase: got %v, want not found", err)
	}
	trees, _ := os.ReadDir(m.treesDir())
	tmps, _ := os.ReadDir(m.tmpDir())
	if len(trees) != 1 || len(tmps) != 0 {
		t.Errorf("after the refused create: %d trees (want 1) and %d uploads (want 0) under %s", len(trees), len(tmps), filepath.Dir(m.treesDir()))
	}
}
