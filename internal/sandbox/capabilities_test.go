package sandbox

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
)

// lacking is a driver that declares every capability of the fake but one.
type lacking struct {
	runtime.Driver
	missing runtime.Capability
}

func (l lacking) Info(ctx context.Context) runtime.Info {
	info := l.Driver.Info(ctx)
	info.Capabilities = slices.DeleteFunc(slices.Clone(info.Capabilities), func(c runtime.Capability) bool { return c == l.missing })
	return info
}

// TestCreateRefusedByCapability: a create that needs a capability the
// runtime lacks is FailedPrecondition naming the runtime and the
// capability, and leaves no record, no box and no name behind.
func TestCreateRefusedByCapability(t *testing.T) {
	for _, tc := range []struct {
		name    string
		missing runtime.Capability
		req     *sbxv1.CreateSandboxRequest
	}{
		{"host image", runtime.CapHostImage, &sbxv1.CreateSandboxRequest{Name: "n1"}},
		{"volumes", runtime.CapVolumes, &sbxv1.CreateSandboxRequest{Name: "n2", Volumes: []*sbxv1.VolumeMount{{Volume: "v", Path: "/data"}}}},
		{"codebases", runtime.CapCodebases, &sbxv1.CreateSandboxRequest{Name: "n3", Codebases: []*sbxv1.CodebaseMount{{Codebase: "p"}}}},
		{"path policies", runtime.CapPathPolicies, &sbxv1.CreateSandboxRequest{Name: "n4", PathPolicies: []*sbxv1.PathPolicy{{Path: "/data", Preset: "read-only"}}}},
		{"idle stop", runtime.CapPause, &sbxv1.CreateSandboxRequest{Name: "n5", IdleTimeoutMs: 60000, IdleAction: sbxv1.IdleAction_IDLE_ACTION_STOP}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &env{t: t, dir: t.TempDir()}
			e.open(func(d runtime.Driver) runtime.Driver { return lacking{d, tc.missing} })
			t.Cleanup(e.close)
			ctx := context.Background()
			_, err := e.mgr.Create(ctx, tc.req)
			want := `runtime "fake" does not support`
			if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), string(tc.missing)) {
				t.Fatalf("Create: got %v, want FailedPrecondition containing %q and %q", err, want, tc.missing)
			}
			recs, err := e.store.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) != 0 {
				t.Errorf("store holds %d records after a refused create, want 0", len(recs))
			}
			if list, _ := e.mgr.List(ctx, nil); len(list) != 0 {
				t.Errorf("manager lists %d sandboxes after a refused create, want 0", len(list))
			}
			if boxes, _ := os.ReadDir(e.dir + "/fake"); len(boxes) != 0 {
				t.Errorf("driver state dir holds %d boxes after a refused create, want 0", len(boxes))
			}
		})
	}
}

// TestOperationsRefusedByCapability: stop and diff on a runtime without
// pause or snapshot are refused by name, and the sandbox keeps running.
func TestOperationsRefusedByCapability(t *testing.T) {
	e := &env{t: t, dir: t.TempDir()}
	e.open(func(d runtime.Driver) runtime.Driver { return lacking{d, runtime.CapPause} })
	t.Cleanup(e.close)
	ctx := context.Background()
	sb, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.mgr.Stop(ctx, sb.GetId())
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), `lacks the "pause" capability`) {
		t.Errorf("Stop: got %v, want FailedPrecondition naming \"pause\"", err)
	}
	// The fake never declares "snapshot".
	err = e.mgr.Diff(ctx, sb.GetId(), new(strings.Builder))
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), `lacks the "snapshot" capability`) {
		t.Errorf("Diff: got %v, want FailedPrecondition naming \"snapshot\"", err)
	}
	got, err := e.mgr.Get(ctx, sb.GetId())
	if err != nil {
		t.Fatal(err)
	}
	if got.GetState() != sbxv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Errorf("state after refused calls = %v, want running", got.GetState())
	}
}
