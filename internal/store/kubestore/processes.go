package kubestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/store"
)

// The records of shell sessions and code contexts (codeexec.ProcessStore),
// one Secret each (they hold the marker token of the process's output
// protocol), so that any replica re-attaches a session another one opened.

const keyProcess = "process"

// PutProcess inserts or replaces a process record.
func (s *Store) PutProcess(ctx context.Context, r *store.ProcessRecord) error {
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode %s %s: %w", r.Kind, r.ID, err)
	}
	sec := &corev1.Secret{ObjectMeta: meta(processObject(r.ID), kindProcess, r.SandboxID), Type: typeProcess,
		Data: map[string][]byte{keyProcess: b}}
	sec.Labels[labelProcessKind] = r.Kind
	_, err = s.secrets().Create(ctx, sec, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		var old *corev1.Secret
		if old, err = s.secrets().Get(ctx, sec.Name, metav1.GetOptions{}); err == nil {
			sec.ResourceVersion = old.ResourceVersion
			_, err = s.secrets().Update(ctx, sec, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("save %s %s: %w", r.Kind, r.ID, wrap(err))
	}
	return nil
}

// labelProcessKind selects process records by kind.
const labelProcessKind = "sbx.dev/process-kind"

// DeleteProcess removes a process record; a missing one is not an error.
func (s *Store) DeleteProcess(ctx context.Context, id string) error {
	if err := s.secrets().Delete(ctx, processObject(id), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete process record %s: %w", id, wrap(err))
	}
	return nil
}

// GetProcess returns the record of id; a missing one wraps errdefs.ErrNotFound.
func (s *Store) GetProcess(ctx context.Context, id string) (*store.ProcessRecord, error) {
	sec, err := s.secrets().Get(ctx, processObject(id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("process record %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get process record %s: %w", id, wrap(err))
	}
	var r store.ProcessRecord
	if err := json.Unmarshal(sec.Data[keyProcess], &r); err != nil {
		return nil, fmt.Errorf("decode process record %s: %w", id, err)
	}
	return &r, nil
}

// ListProcesses returns the process records of one kind, oldest first.
func (s *Store) ListProcesses(ctx context.Context, kind string) ([]*store.ProcessRecord, error) {
	var out []*store.ProcessRecord
	opts := metav1.ListOptions{LabelSelector: selector(kindProcess) + "," + labelProcessKind + "=" + kind, Limit: listPage}
	for {
		l, err := s.secrets().List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("list %s records: %w", kind, wrap(err))
		}
		for i := range l.Items {
			var r store.ProcessRecord
			if err := json.Unmarshal(l.Items[i].Data[keyProcess], &r); err != nil {
				continue // unreadable: nothing to re-attach
			}
			out = append(out, &r)
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

// LeaseProcess takes the lease of process id for holder until until, as a
// read-check-write on its record: another holder's lease that has not
// expired refuses it (wrapping errdefs.ErrUnavailable, with the time it
// ends). It returns the holder that took the lease before this one ("" if
// none did), so that a replica can tell whether its attachment is still
// the process's. A missing record wraps errdefs.ErrNotFound.
func (s *Store) LeaseProcess(ctx context.Context, id, holder string, until time.Time) (last string, err error) {
	err = s.modifyProcess(ctx, id, func(r *store.ProcessRecord) error {
		l := r.Lease
		if l.Holder != "" && l.Holder != holder && time.Now().UnixMilli() < l.UntilMs {
			return fmt.Errorf("%s %s is in use through another replica until %s: %w", r.Kind, id,
				time.UnixMilli(l.UntilMs).UTC().Format(time.RFC3339Nano), errdefs.ErrUnavailable)
		}
		last = l.Last
		r.Lease = store.ProcessLease{Holder: holder, UntilMs: until.UnixMilli(), Last: holder}
		return nil
	})
	return last, err
}

// ReleaseProcess gives back holder's lease of process id; a lease another
// holder took meanwhile (this one's expired) and a missing record are left
// alone.
func (s *Store) ReleaseProcess(ctx context.Context, id, holder string) error {
	err := s.modifyProcess(ctx, id, func(r *store.ProcessRecord) error {
		if r.Lease.Holder != holder {
			return errUnchanged
		}
		r.Lease.Holder, r.Lease.UntilMs = "", 0
		return nil
	})
	if errors.Is(err, errUnchanged) || errdefs.IsNotFound(err) {
		return nil
	}
	return err
}

// errUnchanged makes modifyProcess write nothing.
var errUnchanged = errors.New("unchanged")

// modifyProcess applies change to the record of process id as a
// read-check-write with its resourceVersion, retried on conflicts.
func (s *Store) modifyProcess(ctx context.Context, id string, change func(r *store.ProcessRecord) error) error {
	err := retry.RetryOnConflict(conflictBackoff, func() error {
		sec, err := s.secrets().Get(ctx, processObject(id), metav1.GetOptions{})
		if err != nil {
			return err
		}
		var r store.ProcessRecord
		if err := json.Unmarshal(sec.Data[keyProcess], &r); err != nil {
			return fmt.Errorf("decode process record %s: %w", id, err)
		}
		if err := change(&r); err != nil {
			return err
		}
		b, err := json.Marshal(&r)
		if err != nil {
			return fmt.Errorf("encode process record %s: %w", id, err)
		}
		sec.Data[keyProcess] = b
		_, err = s.secrets().Update(ctx, sec, metav1.UpdateOptions{})
		return err
	})
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err):
		return fmt.Errorf("process record %s: %w", id, errdefs.ErrNotFound)
	case apierrors.IsConflict(err):
		return fmt.Errorf("process record %s still contended after %d attempts: %w: %w", id, conflictBackoff.Steps, err, errdefs.ErrUnavailable)
	}
	return wrap(err)
}
