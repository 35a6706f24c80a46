package sandbox

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
)

// fakeCodebases records the manager's calls (the real thing is tested in
// internal/codebase and the integration tests).
type fakeCodebases struct {
	mu        sync.Mutex
	mounted   map[string][]string // sandbox → paths
	conflicts bool
	mountErr  error
	syncs     []string
}

func (f *fakeCodebases) Mount(_ context.Context, id string, cm *sbxv1.CodebaseMount, _ int64) (runtime.Mount, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mountErr != nil {
		return runtime.Mount{}, f.mountErr
	}
	f.mounted[id] = append(f.mounted[id], cm.GetPath())
	return runtime.Mount{Destination: cm.GetPath(), Codebase: &runtime.CodebaseMount{Name: cm.GetCodebase(), Lower: "/nonexistent", Upper: "/nonexistent/u", Work: "/nonexistent/w"}}, nil
}

func (f *fakeCodebases) Unmount(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.mounted, id)
	return nil
}

func (f *fakeCodebases) Sync(_ context.Context, id, path string, _, force bool) (*sbxv1.SyncCodebaseResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.syncs = append(f.syncs, id+":"+path)
	resp := &sbxv1.SyncCodebaseResponse{Codebase: "cb-1", Revision: 1}
	if f.conflicts && !force {
		resp.Conflicts = []*sbxv1.SyncConflict{{Path: "a.txt", Reason: "changed"}}
	}
	return resp, nil
}

func (f *fakeCodebases) MountPaths(_ context.Context, id string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.mounted[id]), nil
}

func (f *fakeCodebases) Cleanup(_ context.Context, keep map[string]bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id := range f.mounted {
		if !keep[id] {
			delete(f.mounted, id)
		}
	}
	return nil
}

func TestCodebaseMountsFollowTheLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	fc := &fakeCodebases{mounted: map[string][]string{}}
	e.mgr.cfg.Codebases = fc
	req := &sbxv1.CreateSandboxRequest{Codebases: []*sbxv1.CodebaseMount{{Codebase: "p"}, {Codebase: "q", Path: "/src"}}}
	sb, err := e.mgr.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fc.mounted[sb.Id], []string{"/workspace", "/src"}; !slices.Equal(got, want) {
		t.Errorf("mounted: got %v, want %v", got, want)
	}
	if got := sb.GetCodebases(); len(got) != 2 || got[0].GetPath() != "/workspace" {
		t.Errorf("sandbox codebases: got %v", got)
	}
	for _, bad := range [][]*sbxv1.CodebaseMount{
		{{Codebase: "p", Path: "/proc/x"}},
		{{Codebase: "p"}, {Codebase: "q"}},
		{{Path: "/x"}},
	} {
		_, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{Codebases: bad})
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("create with %v: got %v, want invalid argument", bad, err)
		}
	}

	// A conflict refuses rm --sync and the sandbox keeps running (thawed).
	fc.conflicts = true
	err = e.mgr.DestroySynced(ctx, sb.Id)
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("destroy with conflicts: got %v, want failed precondition", err)
	}
	if err := e.hello(sb.Id); err != nil {
		t.Errorf("sandbox after refused destroy: %v", err)
	}
	if got, want := fc.syncs, []string{sb.Id + ":/workspace", sb.Id + ":/src"}; !slices.Equal(got, want) {
		t.Errorf("syncs: got %v, want %v", got, want)
	}
	if _, err := e.mgr.SyncCodebase(ctx, sb.Id, "", false, true); err != nil {
		t.Fatal(err)
	}
	if err := e.hello(sb.Id); err != nil {
		t.Errorf("sandbox after sync: %v", err)
	}
	fc.conflicts = false
	if err := e.mgr.DestroySynced(ctx, sb.Id); err != nil {
		t.Fatal(err)
	}
	if err := e.mgr.WaitTeardowns(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := fc.mounted[sb.Id]; ok {
		t.Errorf("mounts left after destroy")
	}

	// A failed mount rolls the create back.
	fc.mountErr = errors.New("boom")
	if _, err := e.mgr.Create(ctx, req); err == nil {
		t.Fatal("create with a failing mount succeeded")
	}
	if list, _ := e.mgr.List(ctx, nil); len(list) != 0 {
		t.Errorf("sandboxes after a failed create: %v", list)
	}
	if len(fc.mounted) != 0 {
		t.Errorf("mounts after a failed create: %v", fc.mounted)
	}
}
