package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

func TestValidProcessID(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{"proc-0123456789abcdef", true},
		{"proc-0123456789ABCDEF", false},
		{"proc-0123456789abcde", false},
		{"proc-0123456789abcdefa", false},
		{"sess-0123456789abcdef", false},
		{"proc-0123456789abcdeg", false},
		{"", false},
	} {
		if got := validProcessID(tc.id); got != tc.want {
			t.Errorf("validProcessID(%q): got %v, want %v", tc.id, got, tc.want)
		}
	}
	if id := newProcessID(); !validProcessID(id) {
		t.Errorf("newProcessID gave %q, which validProcessID refuses", id)
	}
}

func TestCheckTag(t *testing.T) {
	for _, tc := range []struct {
		tag, wantErr string
	}{
		{"", ""},
		{"web-server", ""},
		{"v1.2", ""},
		{"123", "all digits"},
		{"proc-x", "starts with"},
		{strings.Repeat("x", 257), "more than 256"},
		{"a\x00b", "NUL"},
		{"\xff", "UTF-8"},
	} {
		err := checkTag(tc.tag)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("checkTag(%q): %v, want nil", tc.tag, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("checkTag(%q): %v, want an error containing %q", tc.tag, err, tc.wantErr)
		}
	}
}

// TestConnectProcessAnswersAtOnce: following a process that has written
// nothing yields its info at once, not when it first writes or when the
// agent's 10 s keepalive is due (the agent's log stream answers only with
// its first event, so the info must not wait for it).
func TestConnectProcessAnswersAtOnce(t *testing.T) {
	e := newTenancyEnv(t)
	c := e.clients(e.tokA)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := c.proc.StartProcess(ctx, connect.NewRequest(&sbxv1.StartProcessRequest{Exec: &sbxv1.ExecRequest{Sandbox: e.boxA, Argv: []string{"sleep", "60"}}}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetProcess().GetId()
	defer c.proc.RemoveProcess(ctx, connect.NewRequest(&sbxv1.RemoveProcessRequest{Sandbox: e.boxA, Process: id})) //nolint:errcheck
	// Half the keepalive interval: on the old code the first event came
	// with the keepalive.
	fctx, fcancel := context.WithTimeout(ctx, 5*time.Second)
	defer fcancel()
	st, err := c.proc.ConnectProcess(fctx, connect.NewRequest(&sbxv1.ConnectProcessRequest{Sandbox: e.boxA, Process: id, Follow: true}))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer st.Close()
	if !st.Receive() {
		t.Fatalf("got no first event within 5 s: %v", st.Err())
	}
	if got := st.Msg().GetProcess().GetId(); got != id {
		t.Errorf("got first event %v, want process %s's info", st.Msg(), id)
	}
}
