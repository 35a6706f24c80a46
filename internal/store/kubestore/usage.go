package kubestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/retry"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/tenant"
)

// A tenant's usage ledger is a Secret "sbx-usage-<hash of the tenant>"
// listing what each of its sandboxes holds (sandbox.UsageLedger). A create
// adds its sandbox to the ledger as a read-check-write with the ledger's
// resourceVersion, the check being the tenant's quotas against the other
// entries: of creates racing through several replicas, exactly those that
// fit are admitted, whatever each replica's memory holds. Delete takes a
// sandbox out; the replicas' sweep (ReconcileUsage) mends what a replica
// killed between the two writes left. An empty ledger is deleted.

const (
	kindUsage                   = "tenant-usage"
	typeUsage corev1.SecretType = "sbx.dev/tenant-usage"
	keyUsage                    = "usage"
)

// ledger is a tenant's usage ledger.
type ledger struct {
	Tenant  string                 `json:"tenant"`
	Entries map[string]ledgerEntry `json:"entries"`
}

type ledgerEntry struct {
	Usage tenant.Usage `json:"usage"`
	// AtMs is when the entry was written: an entry with no record is a
	// create in flight until it is older than the sweep's grace.
	AtMs int64 `json:"at"`
}

// sum is the usage of every entry but skip's.
func (l *ledger) sum(skip string) tenant.Usage {
	var u tenant.Usage
	for id, e := range l.Entries {
		if id != skip {
			u = u.Add(e.Usage)
		}
	}
	return u
}

func usageObject(tenantName string) string {
	h := sha256.Sum256([]byte(tenantName))
	return "sbx-usage-" + hex.EncodeToString(h[:20])
}

// getLedger reads tenant's ledger; a missing one comes back empty with a
// nil Secret.
func (s *Store) getLedger(ctx context.Context, tenantName string) (*corev1.Secret, *ledger, error) {
	l := &ledger{Tenant: tenantName, Entries: map[string]ledgerEntry{}}
	sec, err := s.secrets().Get(ctx, usageObject(tenantName), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, l, nil
	}
	if err != nil {
		return nil, nil, err
	}
	if err := json.Unmarshal(sec.Data[keyUsage], l); err != nil {
		return nil, nil, fmt.Errorf("decode usage ledger of tenant %q: %w", tenantName, err)
	}
	if l.Entries == nil {
		l.Entries = map[string]ledgerEntry{}
	}
	return sec, l, nil
}

// putLedger writes l over sec (whose resourceVersion is the precondition),
// creates it when sec is nil, or deletes it when l is empty. A create that
// finds one, and a delete that finds a newer one, are conflicts.
func (s *Store) putLedger(ctx context.Context, sec *corev1.Secret, l *ledger) error {
	conflict := func() error {
		return apierrors.NewConflict(schema.GroupResource{Resource: "secrets"}, usageObject(l.Tenant), fmt.Errorf("ledger changed"))
	}
	if len(l.Entries) == 0 {
		if sec == nil {
			return nil
		}
		rv := sec.ResourceVersion
		err := s.secrets().Delete(ctx, sec.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	b, err := json.Marshal(l)
	if err != nil {
		return fmt.Errorf("encode usage ledger of tenant %q: %w", l.Tenant, err)
	}
	if sec == nil {
		sec = &corev1.Secret{ObjectMeta: meta(usageObject(l.Tenant), kindUsage, ""), Type: typeUsage, Data: map[string][]byte{keyUsage: b}}
		delete(sec.Labels, LabelSandbox)
		_, err = s.secrets().Create(ctx, sec, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return conflict()
		}
		return err
	}
	sec.Data = map[string][]byte{keyUsage: b}
	_, err = s.secrets().Update(ctx, sec, metav1.UpdateOptions{})
	return err
}

// changeLedger applies change to tenant's ledger as a read-check-write
// retried on conflicts; change reports whether it changed anything, or an
// error to give up.
func (s *Store) changeLedger(ctx context.Context, tenantName string, change func(l *ledger) (bool, error)) error {
	err := retry.RetryOnConflict(conflictBackoff, func() error {
		sec, l, err := s.getLedger(ctx, tenantName)
		if err != nil {
			return err
		}
		changed, err := change(l)
		if err != nil || !changed {
			return err
		}
		return s.putLedger(ctx, sec, l)
	})
	if apierrors.IsConflict(err) {
		return fmt.Errorf("usage ledger of tenant %q still contended after %d attempts: %w: %w", tenantName, conflictBackoff.Steps, err, errdefs.ErrUnavailable)
	}
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		return fmt.Errorf("usage ledger of tenant %q: %w", tenantName, wrap(err))
	}
	return err // nil, or change's own
}

// Reserve sets sandbox id's usage u in tenant's ledger if check, given
// what the tenant's other sandboxes hold, accepts it (check's error is
// returned as is, and nothing is written).
func (s *Store) Reserve(ctx context.Context, tenantName, id string, u tenant.Usage, check func(others tenant.Usage) error) error {
	return s.changeLedger(ctx, tenantName, func(l *ledger) (bool, error) {
		if err := check(l.sum(id)); err != nil {
			return false, err
		}
		l.Entries[id] = ledgerEntry{Usage: u, AtMs: time.Now().UnixMilli()}
		return true, nil
	})
}

// Unreserve takes sandbox id out of tenant's ledger.
func (s *Store) Unreserve(ctx context.Context, tenantName, id string) error {
	return s.changeLedger(ctx, tenantName, func(l *ledger) (bool, error) {
		if _, ok := l.Entries[id]; !ok {
			return false, nil
		}
		delete(l.Entries, id)
		return true, nil
	})
}

// ReconcileUsage brings the ledgers in line with held (tenant → sandbox id
// → usage), the records a sweep just listed: an entry with no record is
// dropped once older than grace (younger ones are creates in flight), and
// a record with no entry (one made before ledgers, or whose replica died
// between its writes) is added if it still exists.
func (s *Store) ReconcileUsage(ctx context.Context, held map[string]map[string]tenant.Usage, grace time.Duration) error {
	tenants := map[string]bool{}
	for t := range held {
		tenants[t] = true
	}
	opts := metav1.ListOptions{LabelSelector: selector(kindUsage), Limit: listPage}
	for {
		list, err := s.secrets().List(ctx, opts)
		if err != nil {
			return fmt.Errorf("list usage ledgers: %w", wrap(err))
		}
		for i := range list.Items {
			var l ledger
			if json.Unmarshal(list.Items[i].Data[keyUsage], &l) == nil {
				tenants[l.Tenant] = true
			}
		}
		if list.Continue == "" {
			break
		}
		opts.Continue = list.Continue
	}
	var errs []error
	for t := range tenants {
		err := s.changeLedger(ctx, t, func(l *ledger) (bool, error) {
			changed := false
			old := time.Now().Add(-grace).UnixMilli()
			for id, e := range l.Entries {
				if _, ok := held[t][id]; !ok && e.AtMs < old {
					delete(l.Entries, id)
					changed = true
				}
			}
			for id, u := range held[t] {
				if _, ok := l.Entries[id]; ok {
					continue
				}
				// The list may be older than a destroy that took the
				// entry out: add it only for a record that still exists.
				if _, err := s.secrets().Get(ctx, recordObject(id), metav1.GetOptions{}); err != nil {
					continue
				}
				l.Entries[id] = ledgerEntry{Usage: u, AtMs: time.Now().UnixMilli()}
				changed = true
			}
			return changed, nil
		})
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
