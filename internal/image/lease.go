package image

import "context"

// A Lease keeps the images added to it (and so their layers) from being
// pruned until it is released, like containerd's leases: a build holds one
// so that its untagged intermediate images survive a prune between steps.
// Store methods given a context carrying a lease (WithLease) add the images
// they return to it before a prune could run.
type Lease struct {
	s *Store
}

type leaseKey struct{}

// NewLease returns an empty lease; release it with Release.
func (s *Store) NewLease() *Lease {
	l := &Lease{s: s}
	s.mu.Lock()
	if s.leases == nil {
		s.leases = map[*Lease]map[string]bool{}
	}
	s.leases[l] = map[string]bool{}
	s.mu.Unlock()
	return l
}

// Release lets Prune take the lease's images again. It is idempotent.
func (l *Lease) Release() {
	l.s.mu.Lock()
	delete(l.s.leases, l)
	l.s.mu.Unlock()
}

// WithLease returns ctx carrying l.
func WithLease(ctx context.Context, l *Lease) context.Context {
	return context.WithValue(ctx, leaseKey{}, l)
}

// leaseLocked adds digest to the lease ctx carries, if any (s.mu held).
func (s *Store) leaseLocked(ctx context.Context, digest string) {
	l, _ := ctx.Value(leaseKey{}).(*Lease)
	if l == nil || l.s != s {
		return
	}
	if set, ok := s.leases[l]; ok {
		set[digest] = true
	}
}

// leasedLocked reports whether any live lease holds digest (s.mu held).
func (s *Store) leasedLocked(digest string) bool {
	for _, set := range s.leases {
		if set[digest] {
			return true
		}
	}
	return false
}
