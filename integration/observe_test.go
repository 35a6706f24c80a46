package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"iter"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/tenant"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// scrapeMetrics GETs /metrics with tok ("" = none) and returns the status
// and body.
func scrapeMetrics(t *testing.T, addr, tok string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/metrics", nil)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestObserveEndToEnd drives a daemon with two tenants: /metrics needs a
// token and shows each tenant its own sandboxes' series only (the admin
// token all, with the daemon's); acme's event stream shows its sandbox's
// create, execs, OOM kill and destroy in order and nothing of beta's; the
// stats history grows at the sampling interval; the CLI shows both.
func TestObserveEndToEnd(t *testing.T) {
	dir := t.TempDir()
	tokA, tokB, tokAdmin := tenant.NewToken(), tenant.NewToken(), tenant.NewToken()
	tenants := filepath.Join(dir, "tenants.json")
	if err := os.WriteFile(tenants, fmt.Appendf(nil, `{"tenants": [
		{"name": "acme", "tokens": [%q]}, {"name": "beta", "tokens": [%q]}], "admin_tokens": [%q]}`,
		tenant.HashToken(tokA), tenant.HashToken(tokB), tenant.HashToken(tokAdmin)), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemonOpts(t, daemonOpts{token: tokA}, "--tenants", tenants, "--stats-interval", "200ms")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a := d.client()
	defer a.Close()
	b := sbx.NewClient(d.addr, sbx.WithToken(tokB))
	defer b.Close()
	t.Cleanup(func() {
		list, _ := b.List(context.Background())
		for _, sb := range list {
			_ = sb.Destroy(context.Background())
		}
	})

	// Both tenants follow their events from before anything happens.
	follow := func(c *sbx.Client) (chan *sbxv1.Event, context.CancelFunc) {
		sctx, stop := context.WithCancel(ctx)
		ch := make(chan *sbxv1.Event, 1024)
		go func() {
			defer close(ch)
			for ev, err := range c.Events(sctx, &sbxv1.EventsRequest{}) {
				if err != nil {
					return
				}
				ch <- ev
			}
		}()
		return ch, stop
	}
	evA, stopA := follow(a)
	defer stopA()
	evB, stopB := follow(b)
	defer stopB()
	// The streams are live once a first event reaches them: make one
	// (beta's sandbox) and wait for beta's stream to show it.
	sbB, err := b.Create(ctx, sbx.CreateOptions{Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	waitEvent := func(ch chan *sbxv1.Event, what string, match func(*sbxv1.Event) bool, seen *[]*sbxv1.Event) *sbxv1.Event {
		t.Helper()
		timeout := time.After(time.Minute)
		for {
			select {
			case ev, ok := <-ch:
				if !ok {
					t.Fatalf("event stream ended waiting for %s", what)
				}
				*seen = append(*seen, ev)
				if match(ev) {
					return ev
				}
			case <-timeout:
				t.Fatalf("no %s event within a minute", what)
			}
		}
	}
	var seenB []*sbxv1.Event
	waitEvent(evB, "beta's created", func(e *sbxv1.Event) bool {
		return e.GetType() == sbxv1.EventType_EVENT_TYPE_CREATED && e.GetSandboxId() == sbB.ID
	}, &seenB)

	sbA, err := a.Create(ctx, sbx.CreateOptions{Name: "web", MemoryBytes: 64 << 20, Labels: map[string]string{"app": "web"}})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := sbA.Run(ctx, "sh", "-c", "echo hi"); err != nil || r.Code != 0 {
		t.Fatalf("echo: %+v, %v", r, err)
	}
	// A memory hog: the limit kills it (and the sampler sees the kill).
	r, err := sbA.Run(ctx, "sh", "-c", "head -c 200000000 /dev/zero | tail >/dev/null")
	if err != nil || !r.OOMKilled {
		t.Fatalf("memory hog: %+v, %v; want OOM-killed", r, err)
	}
	var seenA []*sbxv1.Event
	waitEvent(evA, "acme's oom", func(e *sbxv1.Event) bool {
		return e.GetType() == sbxv1.EventType_EVENT_TYPE_OOM && e.GetSandboxId() == sbA.ID
	}, &seenA)

	// Metrics: a token is needed; each tenant sees its own sandbox only.
	if code, _ := scrapeMetrics(t, d.addr, ""); code != http.StatusUnauthorized {
		t.Errorf("/metrics without a token: status %d, want 401", code)
	}
	seriesOf := func(id, name string) string {
		return fmt.Sprintf(`sbx_sandbox_memory_limit_bytes{id=%q,name=%q}`, id, name)
	}
	for _, tc := range []struct {
		who        string
		tok        string
		want, deny []string
	}{
		{"acme", tokA, []string{seriesOf(sbA.ID, "web") + " 6.7108864e+07", fmt.Sprintf(`sbx_sandbox_oom_kills_total{id=%q,name="web"} 1`, sbA.ID)},
			[]string{sbB.ID, "go_goroutines"}},
		{"beta", tokB, []string{seriesOf(sbB.ID, "other")}, []string{sbA.ID, "go_goroutines"}},
		{"admin", tokAdmin, []string{seriesOf(sbA.ID, "web"), seriesOf(sbB.ID, "other"), "go_goroutines", "process_resident_memory_bytes",
			`sbx_sandbox_creates_total{how="cold"} 2`, `sbx_sandboxes{runtime="oci",state="running"} 2`}, nil},
	} {
		code, body := scrapeMetrics(t, d.addr, tc.tok)
		if code != http.StatusOK {
			t.Fatalf("%s's scrape: status %d: %s", tc.who, code, body)
		}
		for _, w := range tc.want {
			if !strings.Contains(body, w) {
				t.Errorf("%s's scrape lacks %s", tc.who, w)
			}
		}
		for _, dny := range tc.deny {
			if strings.Contains(body, dny) {
				t.Errorf("%s's scrape shows %s, which it may not see", tc.who, dny)
			}
		}
	}

	// Stats: the history grows one sample an interval.
	var n0 int
	st, err := a.Stats(ctx, true, "web")
	if err != nil || len(st.GetSandboxes()) != 1 {
		t.Fatalf("stats of web: %v, %v", st, err)
	}
	n0 = len(st.GetSandboxes()[0].GetHistory())
	// Three samples at 200 ms: well within waitFor's 10 s.
	waitFor(t, func() bool {
		st, err = a.Stats(ctx, true, "web")
		return err == nil && len(st.GetSandboxes()) == 1 && len(st.GetSandboxes()[0].GetHistory()) >= n0+3
	})
	e := st.GetSandboxes()[0]
	h := e.GetHistory()
	for i := 1; i < len(h); i++ {
		if h[i].GetTimeMs() <= h[i-1].GetTimeMs() {
			t.Errorf("history not in time order at %d: %d after %d", i, h[i].GetTimeMs(), h[i-1].GetTimeMs())
		}
	}
	if e.GetMemoryLimitBytes() != 64<<20 || e.GetExecs() != 2 || e.GetOomKills() != 1 || e.GetCurrent().GetMemoryBytes() <= 0 {
		t.Errorf("stats of web: limit %d execs %d oom %d memory %d; want 64 MiB, 2, 1, > 0",
			e.GetMemoryLimitBytes(), e.GetExecs(), e.GetOomKills(), e.GetCurrent().GetMemoryBytes())
	}
	if st, err := b.Stats(ctx, false, sbA.ID); err == nil {
		t.Errorf("beta's stats of acme's sandbox: got %v, want NotFound", st)
	}

	// The CLI's table shows acme's sandbox to acme, not beta's.
	out, errOut, code := d.cli("", "stats", "--no-stream")
	if code != 0 || !strings.Contains(out, sbA.ID) || !strings.Contains(out, "64MiB") || strings.Contains(out, sbB.ID) {
		t.Errorf("sbx stats --no-stream as acme: exit %d, %q %q; want web's line with its 64MiB limit and no beta sandbox", code, out, errOut)
	}

	if err := sbA.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	waitEvent(evA, "acme's destroyed", func(e *sbxv1.Event) bool {
		return e.GetType() == sbxv1.EventType_EVENT_TYPE_DESTROYED && e.GetSandboxId() == sbA.ID
	}, &seenA)

	// Acme's sandbox's events in order (the sampler's oom may come before
	// or after the hog's exec_ended, which waits for the hog's pipeline).
	var seq []string
	for _, ev := range seenA {
		if ev.GetSandboxId() != sbA.ID {
			t.Errorf("acme's stream shows %s of %s, not acme's sandbox", ev.GetType(), ev.GetSandboxId())
			continue
		}
		w := strings.ToLower(strings.TrimPrefix(ev.GetType().String(), "EVENT_TYPE_"))
		if ev.GetReason() != "" {
			w += "/" + ev.GetReason()
		}
		if ev.GetLabels()["app"] != "web" {
			t.Errorf("%s event: labels %v, want app=web", w, ev.GetLabels())
		}
		seq = append(seq, w)
	}
	want1 := "created/cold started exec_started exec_ended exec_started exec_ended/oom oom destroyed/user"
	want2 := "created/cold started exec_started exec_ended exec_started oom exec_ended/oom destroyed/user"
	if got := strings.Join(seq, " "); got != want1 && got != want2 {
		t.Errorf("acme's events: %s\nwant %s\n(or %s)", got, want1, want2)
	}
	// Beta saw nothing of acme's.
	stopB()
	for ev := range evB {
		seenB = append(seenB, ev)
	}
	for _, ev := range seenB {
		if ev.GetSandboxId() != sbB.ID {
			t.Errorf("beta's stream shows %s of %s", ev.GetType(), ev.GetSandboxId())
		}
	}

	// The CLI replays acme's events.
	out, errOut, code = d.cli("", "events", "--since", "5m", "--no-follow", "--json", "--filter", "sandbox=web,type=destroyed")
	if code != 0 {
		t.Fatalf("sbx events: exit %d: %s", code, errOut)
	}
	var ev map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &ev); err != nil {
		t.Fatalf("sbx events --json: %v in %q", err, out)
	}
	if ev["type"] != "destroyed" || ev["reason"] != "user" || ev["sandboxId"] != sbA.ID {
		t.Errorf("sbx events --json: %v, want acme's destroyed, reason user", ev)
	}
}

// TestObservePidsLimitEvent: a fork refused at a sandbox's PID limit (user
// code's, in its user cgroup) shows as a pids_limit event and in the
// sandbox's stats and metrics. A dash loop stops at its first failed fork,
// so the box is left at its limit, not spinning.
func TestObservePidsLimitEvent(t *testing.T) {
	d := startDaemon(t, "--stats-interval", "200ms")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := d.client()
	defer c.Close()
	sb, err := c.Create(ctx, sbx.CreateOptions{Pids: 64})
	if err != nil {
		t.Fatal(err)
	}
	// The stream starts at the first next(): replay from before the forks.
	evs := c.Events(ctx, &sbxv1.EventsRequest{Sandboxes: []string{sb.ID}, Types: []sbxv1.EventType{sbxv1.EventType_EVENT_TYPE_PIDS_LIMIT},
		SinceMs: time.Now().Add(-time.Minute).UnixMilli()})
	next, stop := iter.Pull2(evs)
	defer stop()
	r, err := sb.Run(ctx, "sh", "-c", "i=0; while [ $i -lt 200 ]; do sleep 60 & i=$((i+1)); done")
	if err != nil || r.Code == 0 {
		t.Fatalf("forking past the limit: %+v, %v; want the shell to fail a fork", r, err)
	}
	ev, err, ok := next()
	if !ok || err != nil {
		t.Fatalf("no pids_limit event: %v", err)
	}
	if ev.GetCount() < 1 || ev.GetSandboxId() != sb.ID {
		t.Errorf("pids_limit event %v, want a count of at least 1 for %s", ev, sb.ID)
	}
	st, err := c.Stats(ctx, false, sb.ID)
	if err != nil || len(st.GetSandboxes()) != 1 || st.GetSandboxes()[0].GetPidsLimitHits() < 1 {
		t.Errorf("stats: %v, %v; want pids_limit_hits at least 1", st, err)
	}
	if _, body := scrapeMetrics(t, d.addr, ""); !strings.Contains(body, fmt.Sprintf(`sbx_sandbox_pids_limit_hits_total{id=%q,name=""} `, sb.ID)) ||
		strings.Contains(body, fmt.Sprintf(`sbx_sandbox_pids_limit_hits_total{id=%q,name=""} 0`, sb.ID)) {
		t.Errorf("metrics lack a non-zero sbx_sandbox_pids_limit_hits_total for %s", sb.ID)
	}
}
