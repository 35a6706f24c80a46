package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
	k8sdriver "github.com/sbxdev/sbx/internal/runtime/kubernetes"
)

// k8sWarmPools parses `--k8s-warm-pool [RUNTIME=]IMAGE=N` values into the
// pools of each kubernetes runtime: N ready pods of IMAGE (the reference
// as creates name it) with the daemon's default limits, which a create of
// that image naming no limits claims.
func k8sWarmPools(values []string, runtimes map[string]string, defaults runtime.Resources) (map[string][]k8sdriver.PoolSpec, error) {
	out := map[string][]k8sdriver.PoolSpec{}
	for _, v := range values {
		parts := strings.Split(v, "=")
		name := k8sdriver.Name
		if len(parts) == 3 {
			name, parts = parts[0], parts[1:]
		}
		if len(parts) != 2 || parts[0] == "" {
			return nil, fmt.Errorf("--k8s-warm-pool %q: want [RUNTIME=]IMAGE=N: %w", v, errdefs.ErrInvalidArgument)
		}
		if _, ok := runtimes[name]; !ok {
			return nil, fmt.Errorf("--k8s-warm-pool %q: %q is not a kubernetes runtime: %w", v, name, errdefs.ErrInvalidArgument)
		}
		n, err := strconv.Atoi(parts[1])
		if err != nil || n < 0 {
			return nil, fmt.Errorf("--k8s-warm-pool %q: %q is not a count of pods: %w", v, parts[1], errdefs.ErrInvalidArgument)
		}
		out[name] = append(out[name], k8sdriver.PoolSpec{Image: parts[0], Resources: defaults, Size: n})
	}
	return out, nil
}

// startK8sPools starts filling the kubernetes runtimes' warm pools and
// sweeping dead replicas' pool pods (after the manager's Recover: its
// Cleanup deletes every pod no record keeps) and returns what deletes this
// daemon's unclaimed pool pods and its pool Lease at stop.
func startK8sPools(drivers map[string]runtime.Driver, log *slog.Logger) func() {
	var started []*k8sdriver.Driver
	for _, d := range drivers {
		if kd, ok := d.(*k8sdriver.Driver); ok {
			kd.StartPool()
			started = append(started, kd)
		}
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, kd := range started {
			if err := kd.Close(ctx); err != nil {
				log.Warn("kubernetes warm pool: deleting its pods", "runtime", kd.Name(), "err", err)
			}
		}
	}
}
