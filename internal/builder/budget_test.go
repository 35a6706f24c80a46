package builder

import (
	"errors"
	"strings"
	"testing"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
)

// The budget admits charges within both the tenant's share and the
// daemon's total, refuses the rest naming which, and gives bytes back.
func TestMemoryBudget(t *testing.T) {
	b := newMemoryBudget(100, 60)
	for _, step := range []struct {
		tenant string
		n      int64
		want   string // "" admitted, else part of the ResourceExhausted error
	}{
		{"a", 50, ""},
		{"a", 20, "one tenant's builds"},
		{"a", 10, ""},
		{"b", 41, "the daemon's"},
		{"b", 40, ""},
		{"c", 1, "the daemon's"},
	} {
		err := b.charge(step.tenant, step.n)
		switch {
		case step.want == "" && err != nil:
			t.Fatalf("charge(%s, %d): got %v, want it admitted", step.tenant, step.n, err)
		case step.want != "" && (!errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), step.want)):
			t.Fatalf("charge(%s, %d): got %v, want ResourceExhausted naming %q", step.tenant, step.n, err, step.want)
		}
	}
	b.release("a", 60)
	b.release("b", 40)
	if b.held != 0 || len(b.byTenant) != 0 {
		t.Fatalf("after releasing everything: got held %d, tenants %v, want none", b.held, b.byTenant)
	}
	if err := b.charge("c", 60); err != nil {
		t.Fatalf("charge after release: %v", err)
	}
}

// A Dockerfile build is charged its request, its context's entries and its
// copies at their bound; a recipe build its request.
func TestHeldBytes(t *testing.T) {
	ctx := make([]byte, 10<<20)
	df := &sbxv1.BuildImageRequest{Dockerfile: "FROM a", Context: ctx}
	if got, min := heldBytes(df), int64(2*len(ctx))+copyAllowance(len(ctx)); got < min {
		t.Errorf("dockerfile build with a 10 MiB context: got %d bytes held, want at least %d", got, min)
	}
	if got := copyAllowance(len(ctx)); got != 41<<20 {
		t.Errorf("copy allowance of a 10 MiB context: got %d, want %d", got, 41<<20)
	}
	if got := copyAllowance(MaxContextBytes); got != maxCopyTarBytes {
		t.Errorf("copy allowance of the largest context: got %d, want %d", got, maxCopyTarBytes)
	}
	largest := &sbxv1.BuildImageRequest{Dockerfile: "FROM a", Context: make([]byte, MaxContextBytes)}
	if got, max := heldBytes(largest), int64(DefaultTenantMemoryBudget); got > max {
		t.Errorf("a build with the largest context holds %d, more than a tenant's budget %d", got, max)
	}
	recipe := &sbxv1.BuildImageRequest{Recipe: &sbxv1.Recipe{From: "a", Steps: []*sbxv1.RecipeStep{
		{Step: &sbxv1.RecipeStep_Copy{Copy: &sbxv1.CopyStep{Dest: "/x", Tar: make([]byte, 1<<20)}}}}}}
	if got := heldBytes(recipe); got < 1<<20 || got > 1<<20+1024 {
		t.Errorf("recipe build with a 1 MiB copy: got %d bytes held, want about 1 MiB", got)
	}
}
