package server

import (
	"context"
	"testing"

	"connectrpc.com/connect"
)

// TestRelayBudgetShared: a sandbox's relays share one budget, other
// sandboxes have their own, and it is let go with its last relay.
func TestRelayBudgetShared(t *testing.T) {
	b := newRelayBudgets(1 << 20)
	a1, done1 := b.acquire("a")
	a2, done2 := b.acquire("a")
	other, doneOther := b.acquire("b")
	if a1 != a2 {
		t.Errorf("two relays of sandbox a got budgets %p and %p, want one", a1, a2)
	}
	if a1 == other {
		t.Errorf("sandboxes a and b share a budget")
	}
	done1()
	if got := len(b.byID); got != 2 {
		t.Errorf("after one of a's two relays ended: %d budgets, want 2", got)
	}
	done2()
	doneOther()
	if got := len(b.byID); got != 0 {
		t.Errorf("after every relay ended: %d budgets, want 0", got)
	}
}

// TestRelayBudgetSpend: the burst goes at once, an event beyond it waits
// (here for a context that has ended: spend says so with Canceled), and
// each event costs RelayFrameCost on top of its bytes.
func TestRelayBudgetSpend(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name   string
		spends []int // each spent with the ended context
		want   []bool
	}{
		{"within the burst", []int{relayBurst - RelayFrameCost}, []bool{true}},
		{"one byte over the burst", []int{relayBurst - RelayFrameCost + 1}, []bool{false}},
		{"frame cost counts", []int{0, relayBurst - 2*RelayFrameCost, 0}, []bool{true, true, false}},
		{"larger than the burst", []int{4 * relayBurst}, []bool{false}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newRelayBudgets(1) // a byte a second: nothing refills during the test
			rb, done := b.acquire("box")
			defer done()
			for i, n := range tc.spends {
				err := rb.spend(ended, n)
				if got := err == nil; got != tc.want[i] {
					t.Fatalf("spend %d of %d bytes: got %v, want immediate=%v", i, n, err, tc.want[i])
				}
				if err != nil && connect.CodeOf(err) != connect.CodeCanceled {
					t.Errorf("spend %d: got %v, want Canceled", i, err)
				}
			}
		})
	}
	var none *relayBudget
	if err := none.spend(ended, 1<<30); err != nil {
		t.Errorf("no budget: got %v, want nil", err)
	}
	if _, done := (*relayBudgets)(nil).acquire("x"); done == nil {
		t.Error("nil budgets: no release func")
	}
}

// TestRelayBudgetShort: short says when the next event of a size would
// wait, so that a relay sends what it holds first.
func TestRelayBudgetShort(t *testing.T) {
	b := newRelayBudgets(1)
	rb, done := b.acquire("box")
	defer done()
	if rb.short(relayBurst - RelayFrameCost) {
		t.Errorf("a full bucket: short(%d) = true, want false", relayBurst-RelayFrameCost)
	}
	if err := rb.spend(context.Background(), relayBurst/2); err != nil {
		t.Fatal(err)
	}
	if !rb.short(relayBurst / 2) {
		t.Errorf("half a bucket and the frame cost spent: short(%d) = false, want true", relayBurst/2)
	}
	if (*relayBudget)(nil).short(1 << 30) {
		t.Error("no budget: short = true, want false")
	}
}
