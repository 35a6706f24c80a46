package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/image"
	"github.com/sbxdev/sbx/internal/tenant"
	"github.com/sbxdev/sbx/internal/volume"
)

// refusingStores fails the test if a pull gets as far as a store.
type refusingStores struct{ t *testing.T }

func (s refusingStores) Images(context.Context) (*image.Store, error) {
	s.t.Error("AutoPull reached the image store")
	return nil, errors.New("no store")
}
func (s refusingStores) Volumes(context.Context) (*volume.Manager, error) { return nil, nil }
func (s refusingStores) CheckStorage(context.Context) error {
	s.t.Error("AutoPull checked the storage quota")
	return nil
}
func (s refusingStores) ReserveStorage(context.Context, int64) (func(), error) { return func() {}, nil }
func (s refusingStores) InUse(context.Context) map[string]bool                 { return nil }
func (s refusingStores) Settle(context.Context)                                {}

// AutoPull never pulls for a scoped sandbox token (a box must not make the
// daemon fetch from registries, loopback ones included), nor for "host"
// or bare digests: each gets the store's NotFound, saying why.
func TestAutoPullRefusals(t *testing.T) {
	p := NewPuller(refusingStores{t}, nil)
	scoped := tenant.WithPrincipal(context.Background(), tenant.Principal{Tenant: "acme", Scope: "parent-box"})
	for _, tc := range []struct {
		name string
		ctx  context.Context
		ref  string
		want string
	}{
		{"scoped token", scoped, "127.0.0.1:5000/internal/admin:latest", "a scoped sandbox token may not pull images"},
		{"host", context.Background(), "host", `image "host"`},
		{"digest", context.Background(), "sha256:" + strings.Repeat("ab", 32), `image "sha256:abab`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			notFound := fmt.Errorf("image %q: %w", tc.ref, errdefs.ErrNotFound) // as the store says it
			_, err := p.AutoPull(tc.ctx, tc.ref, notFound)
			if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want NotFound containing %q", err, tc.want)
			}
		})
	}
}
