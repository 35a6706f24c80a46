package integration

import (
	"context"
	"testing"
	"time"

	"github.com/sbxdev/sbx/internal/loadgen"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestLoad is the short version of `sbx-bench -only load`: 16 clients × 10 s
// of mixed calls (create, exec, file write and read, list, get, destroy)
// against one daemon, with no error but the deliberate ones (a get of a
// missing sandbox must say NotFound), and nothing left behind. Timings are
// logged, not asserted. SBX_LOAD_CLIENTS / SBX_LOAD_SECONDS scale it up.
func TestLoad(t *testing.T) {
	d := startDaemon(t)
	clients := envInt(t, "SBX_LOAD_CLIENTS", 16)
	secs := envInt(t, "SBX_LOAD_SECONDS", 10)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rep := loadgen.Run(ctx, loadgen.Config{
		Clients: clients, Duration: time.Duration(secs) * time.Second, Seed: uint64(time.Now().UnixNano()),
		OnCreate: d.remember,
	}, func() *sbx.Client { return d.client() })
	t.Logf("%d clients × %ds:\n%s", clients, secs, rep)
	if rep.Unexpected > 0 {
		t.Errorf("%d unexpected errors under load", rep.Unexpected)
	}
	if n := rep.Stats[loadgen.OpCreate]; n == nil || n.Calls-n.Errors == 0 {
		t.Errorf("no sandbox was created under load")
	}
	if list, err := d.client().List(ctx); err != nil || len(list) != 0 {
		t.Errorf("after the load: %d sandboxes listed (%v), want none", len(list), err)
	}
	d.assertNoLeaks()
}
