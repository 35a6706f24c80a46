package codeexec

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sbxdev/sbx/internal/agentconn"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/store"
)

// fakeProc stands in for a kernel or a session: the registry only needs
// its ids and close.
type fakeProc struct {
	id, sandbox string
	closed      atomic.Bool
	detached    atomic.Bool
}

func (p *fakeProc) ident() (string, string) { return p.id, p.sandbox }
func (p *fakeProc) close()                  { p.closed.Store(true) }
func (p *fakeProc) detach()                 { p.detached.Store(true) }

// noAgents has no running sandboxes: forgetProcess then only deletes records.
type noAgents struct{}

func (noAgents) Agent(context.Context, string) (*agentconn.Conn, func(), error) {
	return nil, nil, errdefs.ErrNotFound
}

func (noAgents) Sees(context.Context, string) bool { return true }

func (noAgents) ResolveID(_ context.Context, ref string) (string, error) { return ref, nil }

// newTestRegistry returns a registry of contexts over a real store. Its
// restore re-attaches records by their Program: "ok" attaches, "gone" is a
// process that exited, "down" a sandbox that is stopped.
func newTestRegistry(t *testing.T) (*registry[*fakeProc], *store.Store, *[]string) {
	t.Helper()
	st, err := store.Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	var restored []string
	g := &registry[*fakeProc]{kind: store.ProcessContext, noun: "context", what: "code context", proc: "kernel",
		log: slog.New(slog.DiscardHandler), agents: noAgents{}, store: st, live: map[string]*fakeProc{}}
	g.restore = func(_ context.Context, r *store.ProcessRecord) error {
		restored = append(restored, r.ID)
		switch r.Program {
		case "ok":
			g.put(&fakeProc{id: r.ID, sandbox: r.SandboxID})
			return nil
		case "gone":
			return fmt.Errorf("no detached process %s: %w", r.ID, errdefs.ErrNotFound)
		}
		return fmt.Errorf("sandbox %s is stopped: %w", r.SandboxID, errdefs.ErrFailedPrecondition)
	}
	put := func(id, kind, sandbox, program string) {
		if err := st.PutProcess(context.Background(), &store.ProcessRecord{ID: id, Kind: kind, SandboxID: sandbox, Program: program, Token: []byte("t")}); err != nil {
			t.Fatal(err)
		}
	}
	put("ctx-ok", store.ProcessContext, "sb-1", "ok")
	put("ctx-gone", store.ProcessContext, "sb-1", "gone")
	put("ctx-down", store.ProcessContext, "sb-2", "down")
	put("sess-1", store.ProcessSession, "sb-1", "ok")
	g.put(&fakeProc{id: "ctx-live", sandbox: "sb-1"})
	return g, st, &restored
}

func hasRecord(t *testing.T, st *store.Store, id string) bool {
	t.Helper()
	_, err := st.GetProcess(context.Background(), id)
	if err != nil && !errdefs.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

func TestRegistryGet(t *testing.T) {
	for _, tt := range []struct {
		name, id     string
		wantErr      string // "" for none
		wantNotFound bool
		wantRestored []string
		wantRecord   bool // whether id's record is there afterwards
	}{
		{name: "live", id: "ctx-live"},
		{name: "unknown", id: "ctx-x", wantErr: "context ctx-x: not found", wantNotFound: true},
		{name: "record of another kind", id: "sess-1", wantErr: "context sess-1: not found", wantNotFound: true, wantRecord: true},
		{name: "persisted, re-attached", id: "ctx-ok", wantRestored: []string{"ctx-ok"}, wantRecord: true},
		{name: "persisted, process gone", id: "ctx-gone", wantErr: "context ctx-gone: not found", wantNotFound: true, wantRestored: []string{"ctx-gone"}},
		{name: "persisted, sandbox down", id: "ctx-down", wantErr: "context ctx-down: sandbox sb-2 is stopped", wantRestored: []string{"ctx-down"}, wantRecord: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g, st, restored := newTestRegistry(t)
			got, err := g.get(context.Background(), tt.id)
			if tt.wantErr == "" {
				if err != nil || got == nil || got.id != tt.id {
					t.Fatalf("get(%s): got %v, %v, want the process", tt.id, got, err)
				}
				if again, _ := g.get(context.Background(), tt.id); again != got {
					t.Errorf("second get(%s): got %p, want %p", tt.id, again, got)
				}
			} else {
				if err == nil || !strings.HasPrefix(err.Error(), tt.wantErr) {
					t.Fatalf("get(%s): got %v, want an error starting %q", tt.id, err, tt.wantErr)
				}
				if errdefs.IsNotFound(err) != tt.wantNotFound {
					t.Errorf("get(%s): got NotFound %v, want %v (%v)", tt.id, errdefs.IsNotFound(err), tt.wantNotFound, err)
				}
			}
			if !slices.Equal(*restored, tt.wantRestored) {
				t.Errorf("get(%s): got restores %v, want %v", tt.id, *restored, tt.wantRestored)
			}
			if got := hasRecord(t, st, tt.id); got != tt.wantRecord && tt.id != "ctx-live" {
				t.Errorf("get(%s): got record kept %v, want %v", tt.id, got, tt.wantRecord)
			}
		})
	}
}

func TestRegistryList(t *testing.T) {
	for _, tt := range []struct {
		sandbox      string
		want         []string
		wantRestored []string
	}{
		{sandbox: "", want: []string{"ctx-live", "ctx-ok"}, wantRestored: []string{"ctx-down", "ctx-gone", "ctx-ok"}},
		{sandbox: "sb-1", want: []string{"ctx-live", "ctx-ok"}, wantRestored: []string{"ctx-gone", "ctx-ok"}},
		{sandbox: "sb-2", wantRestored: []string{"ctx-down"}},
	} {
		t.Run("sandbox="+tt.sandbox, func(t *testing.T) {
			g, st, restored := newTestRegistry(t)
			var got []string
			live, _ := g.list(context.Background(), tt.sandbox)
			for _, p := range live {
				got = append(got, p.id)
			}
			slices.Sort(got)
			slices.Sort(*restored)
			if !slices.Equal(got, tt.want) {
				t.Errorf("list(%q): got %v, want %v", tt.sandbox, got, tt.want)
			}
			if !slices.Equal(*restored, tt.wantRestored) {
				t.Errorf("list(%q): got restores %v, want %v", tt.sandbox, *restored, tt.wantRestored)
			}
			// A second list restores only what is still pending.
			*restored = nil
			g.list(context.Background(), tt.sandbox)
			var want []string
			if tt.sandbox != "sb-1" {
				want = []string{"ctx-down"}
			}
			if !slices.Equal(*restored, want) {
				t.Errorf("second list(%q): got restores %v, want %v", tt.sandbox, *restored, want)
			}
			if hasRecord(t, st, "ctx-gone") && slices.Contains(tt.wantRestored, "ctx-gone") {
				t.Errorf("list(%q): got the record of a gone process kept, want it deleted", tt.sandbox)
			}
		})
	}
}

func TestRegistryClose(t *testing.T) {
	for _, tt := range []struct {
		name, id   string
		wantErr    string
		wantRecord bool // whether id's record is there afterwards
	}{
		{name: "live", id: "ctx-live"},
		{name: "persisted, not attached", id: "ctx-down"},
		{name: "unknown", id: "ctx-x", wantErr: "context ctx-x: not found"},
		{name: "record of another kind", id: "sess-1", wantErr: "context sess-1: not found", wantRecord: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g, st, restored := newTestRegistry(t)
			live, _ := g.lookup(tt.id)
			err := g.close(context.Background(), tt.id)
			if gotErr := fmt.Sprint(err); tt.wantErr == "" && err != nil || tt.wantErr != "" && gotErr != tt.wantErr {
				t.Fatalf("close(%s): got %v, want %q", tt.id, err, tt.wantErr)
			}
			if tt.wantErr != "" && !errdefs.IsNotFound(err) {
				t.Errorf("close(%s): got %v, want NotFound", tt.id, err)
			}
			if live != nil && !live.closed.Load() {
				t.Errorf("close(%s): got the process left running, want it closed", tt.id)
			}
			if _, ok := g.lookup(tt.id); ok {
				t.Errorf("close(%s): got it still live, want it dropped", tt.id)
			}
			if got := hasRecord(t, st, tt.id); got != tt.wantRecord {
				t.Errorf("close(%s): got record kept %v, want %v", tt.id, got, tt.wantRecord)
			}
			if len(*restored) != 0 {
				t.Errorf("close(%s): got restores %v, want none", tt.id, *restored)
			}
		})
	}
}

func TestRegistryRestoreAllAndDrop(t *testing.T) {
	g, st, restored := newTestRegistry(t)
	if err := g.restoreAll(context.Background()); err != nil {
		t.Fatalf("restoreAll: got %v, want nil", err)
	}
	slices.Sort(*restored)
	if want := []string{"ctx-down", "ctx-gone", "ctx-ok"}; !slices.Equal(*restored, want) {
		t.Errorf("restoreAll: got restores %v, want %v", *restored, want)
	}
	for id, want := range map[string]bool{"ctx-ok": true, "ctx-gone": false, "ctx-down": true, "sess-1": true} {
		if got := hasRecord(t, st, id); got != want {
			t.Errorf("restoreAll: got record %s kept %v, want %v", id, got, want)
		}
	}
	// Dropping a process whose id another one took since leaves the new one.
	old, _ := g.lookup("ctx-ok")
	g.put(&fakeProc{id: "ctx-ok", sandbox: "sb-1"})
	g.drop(old)
	if p, ok := g.lookup("ctx-ok"); !ok || p == old {
		t.Errorf("drop of a replaced process: got %v, %v, want the new one kept", p, ok)
	}
	g.drop(&fakeProc{id: "ctx-live"})
	if _, ok := g.lookup("ctx-live"); !ok {
		t.Errorf("drop of another process with the same id: got ctx-live dropped, want it kept")
	}
}
