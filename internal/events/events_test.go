package events

import (
	"errors"
	"testing"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
)

func ev(t sbxv1.EventType, id string) Record {
	return Record{Tenant: "a", Event: &sbxv1.Event{Type: t, SandboxId: id}}
}

func all(Record) bool { return true }

func TestReplay(t *testing.T) {
	b := New(Config{RingSize: 4})
	for i := range 6 {
		b.Publish(ev(sbxv1.EventType_EVENT_TYPE_CREATED, string(rune('a'+i))))
	}
	tests := []struct {
		name     string
		after    uint64
		since    int64
		wantSeqs []uint64
	}{
		{"no replay asked", 0, 0, nil},
		{"after seq 4: the rest", 4, 0, []uint64{5, 6}},
		{"after seq 1: only what the ring holds", 1, 0, []uint64{3, 4, 5, 6}},
		{"since the epoch: the whole ring", 0, 1, []uint64{3, 4, 5, 6}},
		{"since the future: nothing", 0, time.Now().Add(time.Hour).UnixMilli(), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			replay, sub, err := b.Subscribe("a", all, tt.after, tt.since)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Unsubscribe(sub)
			var got []uint64
			for _, r := range replay {
				got = append(got, r.Event.GetSeq())
			}
			if len(got) != len(tt.wantSeqs) {
				t.Fatalf("replayed seqs %v, want %v", got, tt.wantSeqs)
			}
			for i := range got {
				if got[i] != tt.wantSeqs[i] {
					t.Fatalf("replayed seqs %v, want %v", got, tt.wantSeqs)
				}
			}
		})
	}
}

func TestLiveInOrderAndFiltered(t *testing.T) {
	b := New(Config{})
	_, sub, err := b.Subscribe("a", func(r Record) bool { return r.Event.GetSandboxId() == "x" }, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Unsubscribe(sub)
	b.Publish(ev(sbxv1.EventType_EVENT_TYPE_CREATED, "x"))
	b.Publish(ev(sbxv1.EventType_EVENT_TYPE_CREATED, "y"))
	b.Publish(ev(sbxv1.EventType_EVENT_TYPE_DESTROYED, "x"))
	for _, want := range []sbxv1.EventType{sbxv1.EventType_EVENT_TYPE_CREATED, sbxv1.EventType_EVENT_TYPE_DESTROYED} {
		r := <-sub.C()
		if r.Event.GetType() != want || r.Event.GetSandboxId() != "x" {
			t.Fatalf("got %v of %s, want %v of x", r.Event.GetType(), r.Event.GetSandboxId(), want)
		}
	}
	select {
	case r := <-sub.C():
		t.Fatalf("got %v of %s, want nothing more", r.Event.GetType(), r.Event.GetSandboxId())
	default:
	}
}

// TestSlowSubscriberIsDropped: a subscriber that reads nothing never
// blocks Publish; it is dropped once its buffer is full, its channel
// closed, and a fast one keeps everything.
func TestSlowSubscriberIsDropped(t *testing.T) {
	b := New(Config{SubBuffer: 8})
	_, slow, err := b.Subscribe("a", all, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, fast, err := b.Subscribe("b", all, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Unsubscribe(fast)
	done := make(chan int)
	go func() {
		n := 0
		for range 100 {
			b.Publish(ev(sbxv1.EventType_EVENT_TYPE_CREATED, "x"))
			if _, ok := <-fast.C(); ok {
				n++
			}
		}
		done <- n
	}()
	select {
	case n := <-done:
		if n != 100 {
			t.Errorf("fast subscriber got %d events, want 100", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Publish blocked on a subscriber that reads nothing")
	}
	n := 0
	for range slow.C() {
		n++
	}
	if !slow.Dropped() || n != 8 {
		t.Errorf("slow subscriber: dropped %v after %d events, want dropped after 8", slow.Dropped(), n)
	}
	if s := b.Subscribers(); s != 1 {
		t.Errorf("subscribers = %d, want 1", s)
	}
}

func TestSubscriberLimits(t *testing.T) {
	b := New(Config{MaxSubscribers: 3, MaxPerKey: 2})
	for range 2 {
		if _, _, err := b.Subscribe("a", all, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := b.Subscribe("a", all, 0, 0); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("third subscriber of one key: err %v, want ResourceExhausted", err)
	}
	_, s, err := b.Subscribe("b", all, 0, 0)
	if err != nil {
		t.Fatalf("another key's subscriber: %v", err)
	}
	if _, _, err := b.Subscribe("c", all, 0, 0); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("subscriber past the total: err %v, want ResourceExhausted", err)
	}
	b.Unsubscribe(s)
	b.Unsubscribe(s) // idempotent
	if _, _, err := b.Subscribe("c", all, 0, 0); err != nil {
		t.Errorf("subscriber after one left: %v", err)
	}
}

func TestNilBusIgnoresPublish(t *testing.T) {
	var b *Bus
	b.Publish(ev(sbxv1.EventType_EVENT_TYPE_CREATED, "x"))
}
