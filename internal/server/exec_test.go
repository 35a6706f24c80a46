package server

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sbxdev/sbx/internal/agentconn"
)

// A client's deadline, which the daemon learns from the timeout header, must
// reach it as DeadlineExceeded, not as Canceled.
func TestCtxError(t *testing.T) {
	dctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-dctx.Done()
	cctx, cancel2 := context.WithCancel(context.Background())
	cancel2()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want connect.Code
	}{
		{"deadline", dctx, connect.CodeDeadlineExceeded},
		{"cancelled", cctx, connect.CodeCanceled},
	} {
		if got := connect.CodeOf(agentconn.ContextError(tc.ctx)); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}
