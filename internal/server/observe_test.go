package server

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
	"github.com/sbxdev/sbx/internal/events"
)

// TestEventsSlowReaderIsDropped: a client that opens an event stream and
// reads nothing never slows the daemon's publishing; its stream is cut once
// its buffer is full and ends, after what was buffered, with
// ResourceExhausted naming the seq to resume after; resuming from there
// replays the rest.
func TestEventsSlowReaderIsDropped(t *testing.T) {
	bus := events.New(events.Config{SubBuffer: 16, RingSize: 100_000})
	s := New(nil)
	s.AddObserve(&Observer{Bus: bus})
	srv := httptest.NewUnstartedServer(s.Handler())
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &protos
	srv.Start()
	defer srv.Close()
	c := sbxv1connect.NewObserveServiceClient(&http.Client{Transport: h2c}, srv.URL, connect.WithGRPC())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := c.Events(ctx, connect.NewRequest(&sbxv1.EventsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// The stream is live once its first message arrives.
	if !st.Receive() || !st.Msg().GetLive() {
		t.Fatalf("first message %v, %v; want live", st.Msg(), st.Err())
	}
	const n = 50_000
	t0 := time.Now()
	for i := range n {
		bus.Publish(events.Record{Event: &sbxv1.Event{Type: sbxv1.EventType_EVENT_TYPE_CREATED, SandboxId: "sb-" + string(rune('a'+i%26))}})
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("publishing %d events took %s with a stalled reader", n, d)
	}
	var last uint64
	got := 0
	for st.Receive() {
		if ev := st.Msg().GetEvent(); ev != nil {
			last = ev.GetSeq()
			got++
		}
	}
	err = st.Err()
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "resume with after_seq") {
		t.Fatalf("stream ended with %v after %d events, want ResourceExhausted saying where to resume", err, got)
	}
	if got >= n {
		t.Fatalf("the stalled reader got all %d events: it was never dropped", got)
	}
	// Resume: the rest comes from the ring, in order, without a gap.
	st2, err := c.Events(ctx, connect.NewRequest(&sbxv1.EventsRequest{AfterSeq: last, NoFollow: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	want := last + 1
	for st2.Receive() {
		if seq := st2.Msg().GetEvent().GetSeq(); seq != want {
			t.Fatalf("resumed stream: seq %d, want %d", seq, want)
		}
		want++
	}
	if err := st2.Err(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if want != n+1 {
		t.Errorf("resumed stream ended at seq %d, want %d", want-1, n)
	}
}
