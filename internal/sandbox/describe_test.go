package sandbox

import (
	"context"
	"sync/atomic"
	"testing"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/runtime"
)

// statsCounter counts the driver's Stats calls.
type statsCounter struct {
	runtime.Driver
	n *atomic.Int64
}

func (s statsCounter) Stats(ctx context.Context, h runtime.Handle) (runtime.Stats, error) {
	s.n.Add(1)
	return s.Driver.Stats(ctx, h)
}

// TestDescribeWithoutStats: resolving a sandbox by name without stats (what
// the SDKs' get does before an exec, GetSandbox with no_stats) asks the
// driver nothing; with stats it measures the box once.
func TestDescribeWithoutStats(t *testing.T) {
	e := newEnv(t)
	var n atomic.Int64
	e.close()
	e.open(func(d runtime.Driver) runtime.Driver { return statsCounter{Driver: d, n: &n} })
	ctx := context.Background()
	sb, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{Name: "named"})
	if err != nil {
		t.Fatal(err)
	}
	base := n.Load()
	for _, tc := range []struct {
		stats     bool
		wantCalls int64
	}{{false, 0}, {true, 1}} {
		got, err := e.mgr.Describe(ctx, "named", tc.stats)
		if err != nil || got.GetId() != sb.GetId() {
			t.Fatalf("Describe(named, stats=%v) = %v, %v; want sandbox %s", tc.stats, got, err, sb.GetId())
		}
		if calls := n.Load() - base; calls != tc.wantCalls {
			t.Errorf("Describe(named, stats=%v): %d driver Stats calls, want %d", tc.stats, calls, tc.wantCalls)
		}
		base = n.Load()
	}
}
