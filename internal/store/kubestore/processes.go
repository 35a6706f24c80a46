package kubestore

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
