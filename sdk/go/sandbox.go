package sbx

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// Sandbox is a handle on one sandbox. Info is a snapshot; Refresh updates it.
type Sandbox struct {
	c    *Client
	ID   string
	Name string
	Info *sbxv1.Sandbox
	// owned: this handle created the sandbox (Close destroys it).
	owned bool
	// ownCodebases were made for it by CreateFromLocal (Close deletes them).
	ownCodebases []string
}

// Owned reports whether this handle created the sandbox (Create,
// CreateFromLocal): then Close destroys it. A handle that found one (Get,
// List, Client.Sandbox) does not own it.
func (s *Sandbox) Owned() bool { return s.owned }

// Close ends what this handle owns, for `defer sb.Close(ctx)` on any handle:
// a sandbox it created is destroyed (and codebases CreateFromLocal made for
// it deleted after it); a sandbox it only found is left running.
func (s *Sandbox) Close(ctx context.Context) error {
	if !s.owned {
		return nil
	}
	if err := s.Destroy(ctx); err != nil && !IsNotFound(err) {
		return err
	}
	s.owned = false
	var errs []error
	for _, cb := range s.ownCodebases {
		if err := s.c.DeleteCodebase(ctx, cb); err != nil && !IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	s.ownCodebases = nil
	return errors.Join(errs...)
}

// Refresh reloads Info (with live stats).
func (s *Sandbox) Refresh(ctx context.Context) error {
	resp, err := s.c.api.GetSandbox(ctx, connect.NewRequest(&sbxv1.GetSandboxRequest{Sandbox: s.ID}))
	if err != nil {
		return wrap("get sandbox "+s.ID, err)
	}
	s.Info = resp.Msg.GetSandbox()
	return nil
}

// Stop freezes every process in the sandbox; Start resumes it.
func (s *Sandbox) Stop(ctx context.Context) error {
	resp, err := s.c.api.StopSandbox(ctx, connect.NewRequest(&sbxv1.StopSandboxRequest{Sandbox: s.ID}))
	if err != nil {
		return wrap("stop sandbox "+s.ID, err)
	}
	s.Info = resp.Msg.GetSandbox()
	return nil
}

// Start resumes a stopped sandbox.
func (s *Sandbox) Start(ctx context.Context) error {
	resp, err := s.c.api.StartSandbox(ctx, connect.NewRequest(&sbxv1.StartSandboxRequest{Sandbox: s.ID}))
	if err != nil {
		return wrap("start sandbox "+s.ID, err)
	}
	s.Info = resp.Msg.GetSandbox()
	return nil
}

// Destroy kills the sandbox and frees everything it held.
func (s *Sandbox) Destroy(ctx context.Context) error {
	_, err := s.c.api.DestroySandbox(ctx, connect.NewRequest(&sbxv1.DestroySandboxRequest{Sandbox: s.ID}))
	return wrap("destroy sandbox "+s.ID, err)
}
