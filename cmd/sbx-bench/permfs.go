package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// permProbe times open+read(1 KiB)+close of one file, alternating between
// a guarded and a plain path in rounds so both see the same machine load,
// and prints the p50 of each in nanoseconds.
const permProbe = `
import os, sys, time
def bench(p, n):
    ds = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fd = os.open(p, os.O_RDONLY)
        os.read(fd, 1024)
        os.close(fd)
        ds.append(time.perf_counter_ns() - t)
    return ds
g, u = [], []
for _ in range(20):
    g += bench("/workspace/output/f", 500)
    u += bench("/data/f", 500)
g.sort(); u.sort()
print(g[len(g)//2], u[len(u)//2])
`

// benchPermFS measures reading a 1 KiB file through a path guard (the
// agent-safe preset) against the same read on the plain overlay of the same
// sandbox. Target: ≤ 2x.
func benchPermFS(ctx context.Context, c *sbx.Client) (guarded, plain time.Duration, err error) {
	sb, err := c.Create(ctx, sbx.CreateOptions{PathPolicies: []sbx.PathPolicy{{Path: "/workspace", Preset: "agent-safe"}}})
	if err != nil {
		return 0, 0, fmt.Errorf("create guarded sandbox: %w", err)
	}
	defer sb.Destroy(context.WithoutCancel(ctx))
	data := []byte(strings.Repeat("x", 1024))
	for _, p := range []string{"/workspace/output/f", "/data/f", "/tmp/probe.py"} {
		body := data
		if p == "/tmp/probe.py" {
			body = []byte(permProbe)
		}
		if err := sb.WriteFile(ctx, p, body, 0o644); err != nil {
			return 0, 0, fmt.Errorf("write %s: %w", p, err)
		}
	}
	res, err := sb.Run(ctx, "/usr/bin/python3", "/tmp/probe.py")
	if err != nil {
		return 0, 0, err
	}
	if res.Code != 0 {
		return 0, 0, fmt.Errorf("probe: exit %d: %s", res.Code, res.Stderr)
	}
	f := strings.Fields(string(res.Stdout))
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("probe printed %q", res.Stdout)
	}
	g, err1 := strconv.ParseInt(f[0], 10, 64)
	u, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("probe printed %q", res.Stdout)
	}
	return time.Duration(g), time.Duration(u), nil
}
