package kubernetes_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/kubernetes"
)

// TestPoolConfigInvalid: New refuses pools it could never fill or tell
// apart, naming them (no cluster needed).
func TestPoolConfigInvalid(t *testing.T) {
	lim := runtime.Resources{MemoryBytes: 256 << 20}
	for _, tc := range []struct {
		name string
		pool []kubernetes.PoolSpec
		want string
	}{
		{name: "no image", pool: []kubernetes.PoolSpec{{Size: 1}}, want: `warm pool of "" (size 1)`},
		{name: "negative size", pool: []kubernetes.PoolSpec{{Image: "py", Size: -1}}, want: `warm pool of "py" (size -1)`},
		{name: "twice", pool: []kubernetes.PoolSpec{{Image: "py", Resources: lim, Size: 1}, {Image: "py", Resources: lim, Size: 2}}, want: `warm pool of "py" with limits`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := kubernetes.New(context.Background(), kubernetes.Config{
				Client: fake.NewSimpleClientset(), Namespace: "ns", AgentImage: "agent", Pool: tc.pool,
			})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("New: got %v, want InvalidArgument containing %q", err, tc.want)
			}
		})
	}
	// The same image with other limits is another pool.
	if _, err := kubernetes.New(context.Background(), kubernetes.Config{
		Client: fake.NewSimpleClientset(), Namespace: "ns", AgentImage: "agent",
		Pool: []kubernetes.PoolSpec{{Image: "py", Resources: lim, Size: 1}, {Image: "py", Size: 1}},
	}); err != nil {
		t.Fatalf("New with one image at two limits: %v", err)
	}
}
