package sbx

import (
	"context"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// UpdateOptions change a running or stopped sandbox. Nil pointers, zero
// limits and empty label fields keep what the sandbox has.
type UpdateOptions struct {
	// Timeout is a new lifetime counted from now (E2B's setTimeout): the
	// sandbox is destroyed this long after the update, sooner or later
	// than before. 0 removes the limit where the daemon has no maximum.
	Timeout *time.Duration
	// IdleTimeout is a new idle timeout (0: none); StopWhenIdle says
	// whether idling stops (true) or destroys (false) the sandbox.
	IdleTimeout  *time.Duration
	StopWhenIdle *bool
	// SetLabels adds or replaces labels, RemoveLabels removes keys;
	// ReplaceLabels makes the labels exactly SetLabels.
	SetLabels     map[string]string
	RemoveLabels  []string
	ReplaceLabels bool
	// MemoryBytes, CPUs and Pids are new limits (0: unchanged). The
	// runtime must be able to change them (its "update" capability), and
	// they count against the tenant's quotas like a create's.
	MemoryBytes int64
	CPUs        float64
	Pids        int64
	// AutoResume: a stopped sandbox is started by its next use.
	AutoResume *bool
}

// Request converts the options to the API request for sandbox ref.
func (o UpdateOptions) Request(ref string) *sbxv1.UpdateSandboxRequest {
	req := &sbxv1.UpdateSandboxRequest{
		Sandbox: ref, SetLabels: o.SetLabels, RemoveLabels: o.RemoveLabels, ReplaceLabels: o.ReplaceLabels,
		AutoResume: o.AutoResume,
	}
	if o.Timeout != nil {
		req.TimeoutMs = new(o.Timeout.Milliseconds())
	}
	if o.IdleTimeout != nil {
		req.IdleTimeoutMs = new(o.IdleTimeout.Milliseconds())
	}
	if o.StopWhenIdle != nil {
		req.IdleAction = sbxv1.IdleAction_IDLE_ACTION_DESTROY
		if *o.StopWhenIdle {
			req.IdleAction = sbxv1.IdleAction_IDLE_ACTION_STOP
		}
	}
	if o.MemoryBytes != 0 || o.CPUs != 0 || o.Pids != 0 {
		req.Resources = &sbxv1.Resources{MemoryBytes: o.MemoryBytes, CpuMillis: int64(o.CPUs * 1000), Pids: o.Pids}
	}
	return req
}

// Update changes the sandbox's lifetime, idle timeout, labels, limits or
// auto-resume; what opts leave unset keeps its value. Nothing changes if
// any part is refused.
func (s *Sandbox) Update(ctx context.Context, opts UpdateOptions) error {
	resp, err := s.c.api.UpdateSandbox(ctx, connect.NewRequest(opts.Request(s.ID)))
	if err != nil {
		return wrap("update sandbox "+s.ID, err)
	}
	s.Info = resp.Msg.GetSandbox()
	return nil
}

// SetTimeout gives the sandbox a new lifetime counted from now (E2B's
// setTimeout): it is destroyed d after this call.
func (s *Sandbox) SetTimeout(ctx context.Context, d time.Duration) error {
	return s.Update(ctx, UpdateOptions{Timeout: &d})
}

// SetLabels makes the sandbox's labels exactly labels (Modal's set_tags).
func (s *Sandbox) SetLabels(ctx context.Context, labels map[string]string) error {
	return s.Update(ctx, UpdateOptions{SetLabels: labels, ReplaceLabels: true})
}
