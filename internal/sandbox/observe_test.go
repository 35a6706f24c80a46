package sandbox

import (
	"context"
	"strings"
	"testing"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/events"
	"github.com/sbxdev/sbx/internal/runtime"
)

func eventWord(e *sbxv1.Event) string {
	w := strings.ToLower(strings.TrimPrefix(e.GetType().String(), "EVENT_TYPE_"))
	if e.GetReason() != "" {
		w += "/" + e.GetReason()
	}
	return w
}

// TestManagerEvents: each sandbox's lifecycle events come in order with
// the reason that ended it: a user's stop, start and destroy, the lifetime
// timeout, the idle timeout (stop or destroy), a failed create.
func TestManagerEvents(t *testing.T) {
	e := newEnv(t)
	bus := events.New(events.Config{})
	e.mgr.cfg.Events = bus
	_, sub, err := bus.Subscribe("", func(events.Record) bool { return true }, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	mk := func(req *sbxv1.CreateSandboxRequest) string {
		t.Helper()
		sb, err := e.mgr.Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return sb.Id
	}
	user := mk(&sbxv1.CreateSandboxRequest{Name: "u", Labels: map[string]string{"k": "v"}})
	life := mk(&sbxv1.CreateSandboxRequest{TimeoutMs: 100})
	idleStop := mk(&sbxv1.CreateSandboxRequest{IdleTimeoutMs: 100, IdleAction: sbxv1.IdleAction_IDLE_ACTION_STOP})
	idleDestroy := mk(&sbxv1.CreateSandboxRequest{IdleTimeoutMs: 100})
	if _, err := e.mgr.Stop(ctx, user); err != nil {
		t.Fatal(err)
	}
	if _, err := e.mgr.Start(ctx, user); err != nil {
		t.Fatal(err)
	}
	if err := e.mgr.Destroy(ctx, user); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		user:        "created/cold started stopped/user started/user destroyed/user",
		life:        "created/cold started destroyed/timeout",
		idleStop:    "created/cold started stopped/idle",
		idleDestroy: "created/cold started destroyed/idle",
	}
	got := map[string][]string{}
	done := func() bool {
		for id, w := range want {
			if strings.Join(got[id], " ") != w {
				return false
			}
		}
		return true
	}
	timeout := time.After(20 * time.Second)
	for !done() {
		select {
		case r := <-sub.C():
			got[r.Event.GetSandboxId()] = append(got[r.Event.GetSandboxId()], eventWord(r.Event))
			if r.Event.GetSandboxId() == user && r.Event.GetLabels()["k"] != "v" {
				t.Errorf("%s of u: labels %v, want k=v", eventWord(r.Event), r.Event.GetLabels())
			}
		case <-timeout:
			for id, w := range want {
				if g := strings.Join(got[id], " "); g != w {
					t.Errorf("events of %s: %q, want %q", id, g, w)
				}
			}
			t.FailNow()
		}
	}
}

func TestManagerFailedCreateEvent(t *testing.T) {
	e := newEnv(t)
	e.mgr.Close()
	e.store.Close()
	e.open(func(d runtime.Driver) runtime.Driver { return failingDriver{d} })
	bus := events.New(events.Config{})
	e.mgr.cfg.Events = bus
	_, sub, err := bus.Subscribe("", func(events.Record) bool { return true }, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.mgr.Create(context.Background(), &sbxv1.CreateSandboxRequest{Name: "doomed"}); err == nil {
		t.Fatal("create with a failing driver succeeded")
	}
	select {
	case r := <-sub.C():
		if w := eventWord(r.Event); w != "failed/create" || r.Event.GetSandboxName() != "doomed" || !strings.Contains(r.Event.GetDetail(), "injected") {
			t.Errorf("got %s of %q (%s), want failed/create of doomed naming the injected failure", w, r.Event.GetSandboxName(), r.Event.GetDetail())
		}
	default:
		t.Fatal("no event for a failed create")
	}
}
