package agentconn

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

func TestAwaitReady(t *testing.T) {
	tests := []struct {
		name    string
		writer  func(w *os.File) // runs before AwaitReady; nil leaves the pipe open
		cancel  bool
		timeout time.Duration
		wantErr string
	}{
		{name: "ready", writer: func(w *os.File) { w.Write([]byte{ReadyByte}); w.Close() }},
		{name: "ready, pipe kept open", writer: func(w *os.File) { w.Write([]byte{ReadyByte}) }},
		{name: "agent exited first", writer: func(w *os.File) { w.Close() }, wantErr: "exited before it served"},
		{name: "wrong byte", writer: func(w *os.File) { w.Write([]byte("x")) }, wantErr: `said 'x'`},
		{name: "timeout", timeout: 50 * time.Millisecond, wantErr: "deadline exceeded"},
		{name: "cancelled", cancel: true, wantErr: "canceled"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			defer w.Close()
			if tc.writer != nil {
				tc.writer(w)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				time.AfterFunc(20*time.Millisecond, cancel)
			}
			timeout := tc.timeout
			if timeout == 0 {
				timeout = time.Minute
			}
			err = AwaitReady(ctx, r, timeout)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("got %v, want ready", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}
