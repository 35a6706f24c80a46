package codeexec

import (
	"context"
	"errors"
	"slices"
	"testing"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// TestBudgetedSinks: a code run's and a session command's output events are
// charged to the relay budget (their data's size) before they are passed
// on, the result is not, and an event the budget refuses (its context
// ended) is not passed on and ends the relay with the budget's error.
func TestBudgetedSinks(t *testing.T) {
	refused := errors.New("budget: context ended")
	tests := []struct {
		name      string
		refuseAt  int // the spend call (1-based) that fails; 0: none
		wantSpent []int
		wantSent  int
		wantErr   error
	}{
		{"every output event is charged", 0, []int{3, 5}, 3, nil},
		{"a refused event is not passed on", 2, []int{3, 5}, 1, refused},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var spent []int
			spend := func(ctx context.Context, n int) error {
				spent = append(spent, n)
				if len(spent) == tc.refuseAt {
					return refused
				}
				return nil
			}
			var sentCode, sentSession int
			code := budgeted(context.Background(), func(*sbxv1.RunCodeEvent) error { sentCode++; return nil }, spend)
			events := []*sbxv1.RunCodeEvent{
				{Event: &sbxv1.RunCodeEvent_Stdout{Stdout: []byte("abc")}},
				{Event: &sbxv1.RunCodeEvent_Stderr{Stderr: []byte("12345")}},
				{Event: &sbxv1.RunCodeEvent_Result{Result: &sbxv1.RunCodeResult{}}},
			}
			var err error
			for _, ev := range events {
				if err = code(ev); err != nil {
					break
				}
			}
			if !errors.Is(err, tc.wantErr) || !slices.Equal(spent, tc.wantSpent) || sentCode != tc.wantSent {
				t.Errorf("code run: got err %v, spent %v, %d events sent; want err %v, spent %v, %d sent", err, spent, sentCode, tc.wantErr, tc.wantSpent, tc.wantSent)
			}

			spent = nil
			session := budgetedSession(context.Background(), func(*sbxv1.SessionExecEvent) error { sentSession++; return nil }, spend)
			sevents := []*sbxv1.SessionExecEvent{
				{Event: &sbxv1.SessionExecEvent_Stdout{Stdout: []byte("abc")}},
				{Event: &sbxv1.SessionExecEvent_Stderr{Stderr: []byte("12345")}},
				{Event: &sbxv1.SessionExecEvent_Result{Result: &sbxv1.SessionExecResult{}}},
			}
			err = nil
			for _, ev := range sevents {
				if err = session(ev); err != nil {
					break
				}
			}
			if !errors.Is(err, tc.wantErr) || !slices.Equal(spent, tc.wantSpent) || sentSession != tc.wantSent {
				t.Errorf("session command: got err %v, spent %v, %d events sent; want err %v, spent %v, %d sent", err, spent, sentSession, tc.wantErr, tc.wantSpent, tc.wantSent)
			}
		})
	}
}
