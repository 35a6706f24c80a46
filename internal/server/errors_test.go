package server

import (
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// TestToConnectReadsOnce: layers that each name what they did reach the
// client once; the code and the sentinel survive.
func TestToConnectReadsOnce(t *testing.T) {
	inner := fmt.Errorf("image %q: %w", "x", errdefs.ErrNotFound)
	for _, c := range []struct {
		err      error
		wantMsg  string
		wantCode connect.Code
	}{
		{fmt.Errorf("image %q: %w", "x", inner), `image "x": not found`, connect.CodeNotFound},
		{fmt.Errorf("create: %w", fmt.Errorf("create: %w", errdefs.ErrInvalidArgument)), "create: invalid argument", connect.CodeInvalidArgument},
		{errors.New("plain"), "plain", connect.CodeInternal},
	} {
		err := toConnect(c.err)
		var ce *connect.Error
		if !errors.As(err, &ce) {
			t.Fatalf("toConnect(%v): not a connect error", c.err)
		}
		if ce.Message() != c.wantMsg || ce.Code() != c.wantCode {
			t.Errorf("toConnect(%q): got %q (%v), want %q (%v)", c.err, ce.Message(), ce.Code(), c.wantMsg, c.wantCode)
		}
		if !errors.Is(err, c.err) {
			t.Errorf("toConnect(%q): the original error is not reachable", c.err)
		}
	}
}
