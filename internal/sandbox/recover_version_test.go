package sandbox

import (
	"context"
	"encoding/json"
	"testing"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime/testsuite"
)

// TestManagerRecoverLeavesNewerBoxes: a sandbox whose driver handle has a
// version the driver does not know (a newer daemon made it, then an older
// one started over the same data dir) is neither destroyed nor forgotten:
// the box keeps running and the record stays for a daemon that
// understands it; this daemon does not serve it.
func TestManagerRecoverLeavesNewerBoxes(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb, err := e.mgr.Create(ctx, &sbxv1.CreateSandboxRequest{Name: "newer"})
	if err != nil {
		t.Fatal(err)
	}
	h := e.mgr.boxes[sb.Id].handle
	e.mgr.Close()
	// What a newer daemon would have persisted: the same box, a handle
	// version from the future.
	var data map[string]any
	if err := json.Unmarshal(h.Data, &data); err != nil {
		t.Fatal(err)
	}
	data["v"] = 1 << 20
	newer := h
	newer.Data, _ = json.Marshal(data)
	rec, err := e.store.Get(ctx, sb.Id)
	if err != nil {
		t.Fatal(err)
	}
	rec.Handle, _ = json.Marshal(newer)
	if err := e.store.Update(ctx, rec); err != nil {
		t.Fatal(err)
	}
	e.store.Close()
	e.open(nil)
	t.Cleanup(func() {
		_ = e.drv.Destroy(ctx, h)
		_ = e.store.Delete(ctx, sb.Id)
	})

	if _, err := e.mgr.Get(ctx, "newer"); !errdefs.IsNotFound(err) {
		t.Errorf("Get(newer) after restart: got %v, want NotFound (not served by this daemon)", err)
	}
	if _, err := e.store.Get(ctx, sb.Id); err != nil {
		t.Errorf("record of the newer sandbox after restart: %v, want it kept", err)
	}
	if err := testsuite.Hello(ctx, e.drv, h); err != nil {
		t.Errorf("box of the newer sandbox after restart: Hello: %v, want it left running", err)
	}
}
