package builder

import (
	"fmt"
	"sync"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// A build holds its request (the recipe, or the Dockerfile and its context
// tar), the context's parsed entries and the tars of its COPY steps in the
// daemon's memory until it ends, which the client can make last hours (a
// FROM from a registry that never answers, a RUN that sleeps). Unbounded,
// a dozen concurrent builds of 40 MiB contexts grew the daemon by 4.8 GiB.
// So what builds hold is charged to a budget: the daemon's and, so that one
// tenant cannot take it all, each tenant's share. A build that does not fit
// is refused at once (ResourceExhausted) rather than queued: a queued one
// would hold its request all the same.
const (
	// DefaultMemoryBudget bounds what all builds under way hold.
	DefaultMemoryBudget = 1 << 30
	// DefaultTenantMemoryBudget bounds what one tenant's builds (the
	// single-user owner's too) hold; the largest build (a 48 MiB context
	// with copies at their bound) needs about 230 MiB.
	DefaultTenantMemoryBudget = 256 << 20
)

// memoryBudget charges bytes to the daemon and to a tenant. Safe for
// concurrent use.
type memoryBudget struct {
	total, perTenant int64

	mu sync.Mutex
	// held and byTenant are the bytes charged now; guarded by mu.
	held     int64
	byTenant map[string]int64
}

func newMemoryBudget(total, perTenant int64) *memoryBudget {
	if total <= 0 {
		total = DefaultMemoryBudget
	}
	if perTenant <= 0 {
		perTenant = DefaultTenantMemoryBudget
	}
	return &memoryBudget{total: total, perTenant: min(perTenant, total), byTenant: map[string]int64{}}
}

// charge adds n bytes of tenant's build, or refuses them naming the budget
// they would exceed.
func (b *memoryBudget) charge(tenant string, n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.byTenant[tenant]+n > b.perTenant:
		return fmt.Errorf("build needs %s of memory in the daemon for its context and copies, but builds under way hold %s of the %s one tenant's builds may hold: "+
			"wait for one to end, or send a smaller context: %w", mib(n), mib(b.byTenant[tenant]), mib(b.perTenant), errdefs.ErrResourceExhausted)
	case b.held+n > b.total:
		return fmt.Errorf("build needs %s of memory in the daemon for its context and copies, but builds under way hold %s of the daemon's %s for builds: "+
			"wait for one to end: %w", mib(n), mib(b.held), mib(b.total), errdefs.ErrResourceExhausted)
	}
	b.held += n
	b.byTenant[tenant] += n
	return nil
}

// release returns n bytes charged to tenant.
func (b *memoryBudget) release(tenant string, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held -= n
	if b.byTenant[tenant] -= n; b.byTenant[tenant] <= 0 {
		delete(b.byTenant, tenant)
	}
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
