package sbx

import (
	"context"
	"errors"
	"testing"

	"connectrpc.com/connect"
)

func TestErrorMatchesContextErrors(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		deadline bool
		canceled bool
	}{
		{"daemon said deadline", connect.NewError(connect.CodeDeadlineExceeded, errors.New("deadline")), true, false},
		{"own deadline", connect.NewError(connect.CodeDeadlineExceeded, context.DeadlineExceeded), true, false},
		{"daemon said canceled", connect.NewError(connect.CodeCanceled, errors.New("canceled")), false, true},
		{"not found", connect.NewError(connect.CodeNotFound, errors.New("no such sandbox")), false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := wrap("exec", tc.err)
			if got := errors.Is(err, context.DeadlineExceeded); got != tc.deadline {
				t.Errorf("errors.Is(%v, DeadlineExceeded) = %v, want %v", err, got, tc.deadline)
			}
			if got := errors.Is(err, context.Canceled); got != tc.canceled {
				t.Errorf("errors.Is(%v, Canceled) = %v, want %v", err, got, tc.canceled)
			}
			var ce *connect.Error
			if !errors.As(err, &ce) || ce.Code() != connect.CodeOf(tc.err) {
				t.Errorf("the connect error is not reachable through %v", err)
			}
		})
	}
	if !IsNotFound(wrap("get", connect.NewError(connect.CodeNotFound, errors.New("x")))) {
		t.Error("IsNotFound lost its code")
	}
}

func TestErrorNamesOpOnce(t *testing.T) {
	for _, c := range []struct{ op, msg, want string }{
		{"stat /x", "stat /x: no such file or directory", "stat /x: no such file or directory"},
		{"snapshot sandbox sb-1", "snapshot sandbox sb-1: tag: bad", "snapshot sandbox sb-1: tag: bad"},
		{"get sandbox x", `sandbox "x": not found`, `get sandbox x: sandbox "x": not found`},
		{"stat /x", "stat /xy: no such file", "stat /x: stat /xy: no such file"},
		{"list", "list", "list"},
	} {
		err := wrap(c.op, connect.NewError(connect.CodeNotFound, errors.New(c.msg)))
		if got := err.Error(); got != c.want {
			t.Errorf("wrap(%q, %q): got %q, want %q", c.op, c.msg, got, c.want)
		}
	}
}
