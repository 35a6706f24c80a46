// Package kubestore keeps the sandbox manager's records in the Kubernetes
// API instead of the local SQLite file (`sbx serve --state kubernetes`), so
// that several daemon replicas behind one address share them: a replica
// finds and reaches a sandbox another one created, and a replica killed at
// any point loses nothing the API server acknowledged.
//
// Layout, all in one namespace, all labelled app.kubernetes.io/managed-by=sbx:
//
//   - a record is a Secret "sbx-box-<id>" of type sbx.dev/sandbox-record
//     whose "record" key holds the store.Record as JSON. A Secret, not a
//     ConfigMap, because a record holds the sandbox's secrets (its spec) and
//     the hash of its scoped token, exactly what the SQLite file keeps 0600;
//     not a CRD, because installing one needs cluster-wide rights and the
//     daemon's RBAC stays inside its namespace; not the Pod's annotations,
//     because a record exists before its Pod and outlives it (destroying).
//   - a name claim is a Secret "sbx-name-<hash of tenant and name>" holding
//     the id that owns the name. Names are unique per tenant across
//     replicas through the API server alone: a claim is created only if
//     absent (the create fails with AlreadyExists), and only a stale claim
//     — its record gone or its name released — is removed by another
//     writer, with the claim's UID and resourceVersion as preconditions.
//   - a process record (shell session, code context) is a Secret
//     "sbx-proc-<id>"; it carries the lease a replica holds while it runs
//     a command in the process (processes.go).
//   - a tenant's usage ledger is a Secret "sbx-usage-<hash of tenant>"
//     listing what each of its sandboxes holds, against which creates are
//     admitted under the tenant's quotas (usage.go).
//
// Every change of a record is a read-check-write with the object's
// resourceVersion (the API server's optimistic concurrency): a conflict is
// retried on the fresh object, so no write is lost between replicas, and
// the check refuses to bring a destroying record back (destroying is
// final, whichever replica marked it).
//
// internal/daemon is its only user; it implements sandbox.Store and
// codeexec.ProcessStore.
package kubestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/store"
)

// Labels and types of the objects this package writes.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	managedBy      = "sbx"
	LabelKind      = "sbx.dev/kind"
	LabelSandbox   = "sbx.dev/sandbox-id"

	kindRecord  = "sandbox-record"
	kindName    = "sandbox-name"
	kindProcess = "process-record"

	typeRecord  corev1.SecretType = "sbx.dev/sandbox-record"
	typeName    corev1.SecretType = "sbx.dev/sandbox-name"
	typeProcess corev1.SecretType = "sbx.dev/process-record"

	keyRecord = "record"
	keyID     = "id"
	keyTenant = "tenant"
	keyName   = "name"

	stateDestroying = "destroying"
)

// Store is the sandbox manager's state in one namespace of a Kubernetes
// API. Safe for concurrent use, by any number of processes.
type Store struct {
	cs kubernetes.Interface
	ns string
}

// New returns a Store over namespace ns of the cluster cs talks to.
func New(cs kubernetes.Interface, ns string) (*Store, error) {
	if ns == "" {
		return nil, fmt.Errorf("kubernetes state needs a namespace: %w", errdefs.ErrInvalidArgument)
	}
	return &Store{cs: cs, ns: ns}, nil
}

// Check asks the API server for the records once: a daemon whose RBAC or
// namespace is wrong fails at start, saying so, not at its first create.
func (s *Store) Check(ctx context.Context) error {
	_, err := s.secrets().List(ctx, metav1.ListOptions{LabelSelector: selector(kindRecord), Limit: 1})
	if err != nil {
		return fmt.Errorf("list sandbox records in namespace %s: %w", s.ns, wrap(err))
	}
	return nil
}

func (s *Store) secrets() secretsAPI { return s.cs.CoreV1().Secrets(s.ns) }

type secretsAPI interface {
	Create(ctx context.Context, sec *corev1.Secret, opts metav1.CreateOptions) (*corev1.Secret, error)
	Update(ctx context.Context, sec *corev1.Secret, opts metav1.UpdateOptions) (*corev1.Secret, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Secret, error)
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.SecretList, error)
}

func selector(kind string) string {
	return LabelManagedBy + "=" + managedBy + "," + LabelKind + "=" + kind
}

func recordObject(id string) string  { return "sbx-box-" + id }
func processObject(id string) string { return "sbx-proc-" + id }

// nameObject is the claim's object name: a hash, as tenants and names may
// hold characters an object name may not.
func nameObject(tenant, name string) string {
	h := sha256.Sum256([]byte(tenant + "\x00" + name))
	return "sbx-name-" + hex.EncodeToString(h[:20])
}

// wrap maps the API server's answers to errdefs sentinels, keeping the
// message.
func wrap(err error) error {
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
	case apierrors.IsAlreadyExists(err):
		return fmt.Errorf("%w: %w", err, errdefs.ErrAlreadyExists)
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		return fmt.Errorf("%w: %w", err, errdefs.ErrPermissionDenied)
	case apierrors.IsRequestEntityTooLargeError(err), apierrors.IsInvalid(err):
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	case apierrors.IsServerTimeout(err), apierrors.IsTimeout(err), apierrors.IsServiceUnavailable(err), apierrors.IsTooManyRequests(err):
		return fmt.Errorf("%w: %w", err, errdefs.ErrUnavailable)
	}
	return err
}

func meta(name, kind, id string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelManagedBy: managedBy, LabelKind: kind, LabelSandbox: id}}
}

func encode(r *store.Record) (map[string][]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode record of %s: %w", r.ID, err)
	}
	return map[string][]byte{keyRecord: b}, nil
}

func decode(sec *corev1.Secret) (*store.Record, error) {
	var r store.Record
	if err := json.Unmarshal(sec.Data[keyRecord], &r); err != nil {
		return nil, fmt.Errorf("decode sandbox record %s: %w", sec.Name, err)
	}
	if sec.Labels[LabelSandbox] != r.ID {
		return nil, fmt.Errorf("sandbox record %s holds id %q, labelled %q", sec.Name, r.ID, sec.Labels[LabelSandbox])
	}
	if string(r.Handle) == "null" {
		r.Handle = nil
	}
	r.Version = sec.ResourceVersion
	return &r, nil
}

// Insert adds a new record and claims its name. A duplicate id or a name
// another live record holds wraps errdefs.ErrAlreadyExists; then nothing of
// r is left behind.
//
// The record is written first, the claim second: a claim therefore always
// names a record that exists or existed, and "stale" (record deleted, or
// its name released by MarkDestroying) is final once true, which is what
// makes removing a stale claim safe. A writer killed between the two
// leaves a creating record without a claim, which the manager's sweep
// removes (it never shows: names are resolved through claims).
func (s *Store) Insert(ctx context.Context, r *store.Record) error {
	data, err := encode(r)
	if err != nil {
		return err
	}
	sec := &corev1.Secret{ObjectMeta: meta(recordObject(r.ID), kindRecord, r.ID), Type: typeRecord, Data: data}
	created, err := s.secrets().Create(ctx, sec, metav1.CreateOptions{})
	if err != nil {
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("sandbox id %q exists: %w", r.ID, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("insert sandbox %s: %w", r.ID, wrap(err))
	}
	r.Version = created.ResourceVersion
	if r.Name == "" {
		return nil
	}
	if err := s.claim(ctx, created, r); err != nil {
		// The record must not outlive a lost claim: it would hold the name
		// in a later sweep's eyes only as a creating leftover, but it
		// costs the API an object until then.
		if derr := s.secrets().Delete(context.WithoutCancel(ctx), created.Name, metav1.DeleteOptions{}); derr != nil && !apierrors.IsNotFound(derr) {
			return errors.Join(err, fmt.Errorf("delete record of %s after losing its name: %w", r.ID, derr))
		}
		return err
	}
	return nil
}

// claimAttempts bounds the claim loop: each turn removes one stale claim,
// and a name can have at most one.
const claimAttempts = 5

// claim makes the name claim of r (whose record object is rec).
func (s *Store) claim(ctx context.Context, rec *corev1.Secret, r *store.Record) error {
	obj := nameObject(r.Tenant, r.Name)
	for range claimAttempts {
		c := &corev1.Secret{
			ObjectMeta: meta(obj, kindName, r.ID), Type: typeName,
			Data: map[string][]byte{keyID: []byte(r.ID), keyTenant: []byte(r.Tenant), keyName: []byte(r.Name)},
		}
		// Deleting the record lets the garbage collector remove a claim
		// the deleter did not.
		c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Secret", Name: rec.Name, UID: rec.UID}}
		_, err := s.secrets().Create(ctx, c, metav1.CreateOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("claim name %q for %s: %w", r.Name, r.ID, wrap(err))
		}
		old, err := s.secrets().Get(ctx, obj, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue // released meanwhile: try again
		}
		if err != nil {
			return fmt.Errorf("read claim of name %q: %w", r.Name, wrap(err))
		}
		holder := string(old.Data[keyID])
		live, err := s.holds(ctx, holder, r.Tenant, r.Name)
		if err != nil {
			return err
		}
		if live {
			return fmt.Errorf("sandbox name %q is taken by %s: %w", r.Name, holder, errdefs.ErrAlreadyExists)
		}
		// Stale: only this very claim (uid and version) goes; if another
		// writer replaced it meanwhile, the next turn looks at that one.
		uid, rv := old.UID, old.ResourceVersion
		err = s.secrets().Delete(ctx, obj, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("remove stale claim of name %q (held by %s): %w", r.Name, holder, wrap(err))
		}
	}
	return fmt.Errorf("claim name %q for %s: still contended after %d attempts: %w", r.Name, r.ID, claimAttempts, errdefs.ErrUnavailable)
}

// holds reports whether record id exists and still holds tenant's name.
func (s *Store) holds(ctx context.Context, id, tenant, name string) (bool, error) {
	sec, err := s.secrets().Get(ctx, recordObject(id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read record %s: %w", id, wrap(err))
	}
	r, err := decode(sec)
	if err != nil {
		// An unreadable record holds nothing it could prove.
		return false, nil //nolint:nilerr // a corrupt record releases its name
	}
	return r.Tenant == tenant && r.Name == name, nil
}

// conflictBackoff paces the retries of a write that lost a race: replicas
// touching and updating one busy record may collide several times in a row,
// so it tries for about 3 s, spread with jitter, before giving up.
var conflictBackoff = wait.Backoff{Steps: 25, Duration: 2 * time.Millisecond, Factor: 1.6, Jitter: 1, Cap: 250 * time.Millisecond}

// modify applies change to the stored record of id, as a read-check-write
// retried on conflicts. change returns an error to give up (nothing is
// written). r, if not nil, gets the written record's version.
func (s *Store) modify(ctx context.Context, id string, r *store.Record, change func(cur *store.Record) error) error {
	var written *corev1.Secret
	err := retry.RetryOnConflict(conflictBackoff, func() error {
		sec, err := s.secrets().Get(ctx, recordObject(id), metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur, err := decode(sec)
		if err != nil {
			return err
		}
		if err := change(cur); err != nil {
			return err
		}
		if sec.Data, err = encode(cur); err != nil {
			return err
		}
		written, err = s.secrets().Update(ctx, sec, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
		}
		if apierrors.IsConflict(err) {
			return fmt.Errorf("still contended after %d attempts: %w: %w", conflictBackoff.Steps, err, errdefs.ErrUnavailable)
		}
		return wrap(err)
	}
	if r != nil {
		r.Version = written.ResourceVersion
	}
	return nil
}

// notDestroying refuses to change a record another writer marked destroying.
func notDestroying(cur *store.Record) error {
	if cur.State == stateDestroying {
		return fmt.Errorf("sandbox %s was destroyed (%s): %w", cur.ID, cur.StateDetail, errdefs.ErrNotFound)
	}
	return nil
}

// Update rewrites the mutable fields of a record (state, handle, detail,
// deadline; the last activity only forward), unless another writer marked
// it destroying.
func (s *Store) Update(ctx context.Context, r *store.Record) error {
	err := s.modify(ctx, r.ID, r, func(cur *store.Record) error {
		if err := notDestroying(cur); err != nil {
			return err
		}
		cur.State, cur.Handle, cur.ExpiresAtMs, cur.StateDetail = r.State, r.Handle, r.ExpiresAtMs, r.StateDetail
		// Replicas see activity each on their own: the latest wins.
		cur.LastActiveAtMs = max(cur.LastActiveAtMs, r.LastActiveAtMs)
		return nil
	})
	if err != nil {
		return fmt.Errorf("update sandbox %s: %w", r.ID, err)
	}
	return nil
}

// UpdateSpec records an updated sandbox: its spec, labels and deadline.
func (s *Store) UpdateSpec(ctx context.Context, r *store.Record) error {
	err := s.modify(ctx, r.ID, r, func(cur *store.Record) error {
		if err := notDestroying(cur); err != nil {
			return err
		}
		cur.Spec, cur.Labels, cur.ExpiresAtMs = r.Spec, r.Labels, r.ExpiresAtMs
		return nil
	})
	if err != nil {
		return fmt.Errorf("update spec of sandbox %s: %w", r.ID, err)
	}
	return nil
}

// MarkDestroying records that a sandbox is being destroyed and releases its
// name. Of two replicas destroying one sandbox, exactly one marks it: the
// other gets errdefs.ErrNotFound, as if it had already gone.
func (s *Store) MarkDestroying(ctx context.Context, r *store.Record) error {
	var name, tenant string
	err := s.modify(ctx, r.ID, r, func(cur *store.Record) error {
		if err := notDestroying(cur); err != nil {
			return err
		}
		name, tenant = cur.Name, cur.Tenant
		cur.State, cur.Handle, cur.StateDetail, cur.Name = r.State, r.Handle, r.StateDetail, ""
		cur.DestroyingSinceMs = time.Now().UnixMilli()
		return nil
	})
	if err != nil {
		return fmt.Errorf("mark sandbox %s destroying: %w", r.ID, err)
	}
	r.Name = ""
	if name != "" {
		// The claim is stale from the write above on; removing it now only
		// saves the next creator of the name a look at the record.
		s.release(ctx, tenant, name, r.ID)
	}
	// A sandbox being destroyed counts against no quota (as with one
	// daemon); what fails here the sweep mends (ReconcileUsage).
	_ = s.Unreserve(ctx, tenant, r.ID)
	return nil
}

// release removes tenant's claim of name if id holds it.
func (s *Store) release(ctx context.Context, tenant, name, id string) {
	obj := nameObject(tenant, name)
	c, err := s.secrets().Get(ctx, obj, metav1.GetOptions{})
	if err != nil || string(c.Data[keyID]) != id {
		return
	}
	uid, rv := c.UID, c.ResourceVersion
	_ = s.secrets().Delete(ctx, obj, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
}

// TouchMany records last-activity times; a record gone or destroying
// meanwhile is skipped. A time is only ever moved forward.
func (s *Store) TouchMany(ctx context.Context, lastActive map[string]int64) error {
	var errs []error
	for id, ms := range lastActive {
		err := s.modify(ctx, id, nil, func(cur *store.Record) error {
			if err := notDestroying(cur); err != nil {
				return err
			}
			cur.LastActiveAtMs = max(cur.LastActiveAtMs, ms)
			return nil
		})
		if err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("touch sandbox %s: %w", id, err))
		}
	}
	return errors.Join(errs...)
}

// Delete removes a record (and its claim, if it still holds one); deleting
// a missing one is not an error.
func (s *Store) Delete(ctx context.Context, id string) error {
	sec, err := s.secrets().Get(ctx, recordObject(id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, wrap(err))
	}
	r, derr := decode(sec)
	if derr == nil && r.Name != "" {
		s.release(ctx, r.Tenant, r.Name, id)
	}
	if derr == nil {
		// Before the record goes, so that a record gone means its quota
		// is free; what fails here the sweep mends (ReconcileUsage).
		_ = s.Unreserve(ctx, r.Tenant, id)
	}
	if err := s.secrets().Delete(ctx, sec.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete sandbox %s: %w", id, wrap(err))
	}
	return nil
}

// Get returns one record by id.
func (s *Store) Get(ctx context.Context, id string) (*store.Record, error) {
	sec, err := s.secrets().Get(ctx, recordObject(id), metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("get sandbox %s: %w", id, wrap(err))
	}
	return decode(sec)
}

// ByName returns the record holding tenant's name: the one its claim
// names, if that record still holds it.
func (s *Store) ByName(ctx context.Context, tenant, name string) (*store.Record, error) {
	c, err := s.secrets().Get(ctx, nameObject(tenant, name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("sandbox name %q: %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("resolve sandbox name %q: %w", name, wrap(err))
	}
	id := string(c.Data[keyID])
	r, err := s.Get(ctx, id)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("sandbox name %q: %w", name, errdefs.ErrNotFound)
		}
		return nil, err
	}
	if r.Tenant != tenant || r.Name != name {
		return nil, fmt.Errorf("sandbox name %q: %w", name, errdefs.ErrNotFound)
	}
	return r, nil
}

// listPage is how many objects one List call asks for.
const listPage = 500

// List returns every record, oldest first. A record that cannot be decoded
// is skipped (it says nothing a manager could act on) — and reported in
// the error joined to the result, which the caller may log.
func (s *Store) List(ctx context.Context) ([]*store.Record, error) {
	var out []*store.Record
	opts := metav1.ListOptions{LabelSelector: selector(kindRecord), Limit: listPage}
	for {
		l, err := s.secrets().List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("list sandboxes: %w", wrap(err))
		}
		for i := range l.Items {
			r, err := decode(&l.Items[i])
			if err != nil {
				continue
			}
			out = append(out, r)
		}
		if l.Continue == "" {
			break
		}
		opts.Continue = l.Continue
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].CreatedAtMs != out[j].CreatedAtMs {
			return out[i].CreatedAtMs < out[j].CreatedAtMs
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}
