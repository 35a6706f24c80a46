package sbx

import (
	"context"
	"errors"
)

// FromLocalOptions tune CreateFromLocal.
type FromLocalOptions struct {
	// Path is where the codebase is mounted ("" = /workspace).
	Path string
	// Preset guards the mount ("" = view-only: names and metadata, no
	// content; "read-only", "agent-safe"... open more) and Rules refine it;
	// Unguarded mounts it with neither: fully writable in the sandbox's own
	// copy-on-write layer (SyncCodebase writes changes back).
	Preset    string
	Rules     []PermissionRule
	Unguarded bool
	// Upload tunes the upload of the directory (its Name names the codebase).
	Upload UploadOptions
	// Create is the rest of the sandbox's options; the codebase's mount is
	// added to its Codebases.
	Create CreateOptions
}

// CreateFromLocal uploads the local directory dir as a codebase and creates
// a sandbox with it mounted and guarded (view-only unless said otherwise),
// in one call, like AgentFense's Sandbox.from_local. The sandbox is owned:
// Close destroys it, then deletes the codebase.
func (c *Client) CreateFromLocal(ctx context.Context, dir string, opts FromLocalOptions) (*Sandbox, error) {
	if opts.Unguarded && (opts.Preset != "" || len(opts.Rules) > 0) {
		return nil, errors.New("create from local: Unguarded with a Preset or Rules")
	}
	resp, err := c.CreateCodebase(ctx, dir, opts.Upload)
	if err != nil {
		return nil, err
	}
	id := resp.GetCodebase().GetId()
	m := CodebaseMount{Codebase: id, Path: opts.Path, Preset: opts.Preset, Rules: opts.Rules}
	if !opts.Unguarded && m.Preset == "" {
		m.Preset = GuardedDefaultPreset
	}
	create := opts.Create
	create.Codebases = append([]CodebaseMount{m}, create.Codebases...)
	sb, err := c.Create(ctx, create)
	if err != nil {
		if derr := c.DeleteCodebase(context.WithoutCancel(ctx), id); derr != nil {
			return nil, errors.Join(err, derr)
		}
		return nil, err
	}
	sb.ownCodebases = []string{id}
	return sb, nil
}
