package mcp

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// session connects an MCP client to a server whose backend is a daemon
// that counts calls and refuses them all.
func session(t *testing.T, lim Limits) (*mcp.ClientSession, *atomic.Int64) {
	t.Helper()
	var calls atomic.Int64
	daemon := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		http.Error(w, "unexpected call", http.StatusTeapot)
	}))
	t.Cleanup(daemon.Close)
	srv := NewServer(NewBackend(daemon.Client(), daemon.URL), lim, nil)
	st, ct := mcp.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs, &calls
}

// TestBadInputNeverReachesTheDaemon: every bound and required field is
// checked before a call is made, and the tool error names the field.
func TestBadInputNeverReachesTheDaemon(t *testing.T) {
	lim := DefaultLimits
	lim.MaxInputBytes = 64
	cs, calls := session(t, lim)
	big := strings.Repeat("x", 65)
	tests := []struct {
		tool string
		args map[string]any
		want string
	}{
		{"exec", map[string]any{"sandbox": "b", "command": big}, "command is 65 bytes: at most 64"},
		{"exec", map[string]any{"sandbox": "b", "command": "true", "stdin": big}, "stdin is 65 bytes"},
		{"exec", map[string]any{"sandbox": "b", "command": ""}, "command is empty"},
		{"exec", map[string]any{"sandbox": "", "command": "true"}, "sandbox is empty"},
		{"exec", map[string]any{"sandbox": "b", "command": "true", "timeout_seconds": 601}, "timeout_seconds is 601: at most 600"},
		{"exec", map[string]any{"sandbox": "b", "command": "true", "timeout_seconds": -1}, "timeout_seconds is -1"},
		{"run_code", map[string]any{"sandbox": "b", "code": big}, "code is 65 bytes"},
		{"run_code", map[string]any{"sandbox": "b", "code": "1", "libraries": make([]string, 101)}, "101 libraries: at most 100"},
		{"write_file", map[string]any{"sandbox": "b", "path": "/x", "content": big}, "content is 65 bytes"},
		{"write_file", map[string]any{"sandbox": "b", "path": "/x", "content": "!!", "base64": true}, "not valid base64"},
		{"create_sandbox", map[string]any{"timeout_seconds": 86401}, "timeout_seconds is 86401: at most 86400"},
		{"expose_port", map[string]any{"sandbox": "b", "port": 0}, "port is 0: want 1-65535"},
		{"expose_port", map[string]any{"sandbox": "b", "port": 70000}, "port is 70000"},
		{"destroy_sandbox", map[string]any{"sandbox": ""}, "sandbox is empty"},
		{"read_file", map[string]any{"sandbox": "", "path": "/x"}, "sandbox is empty"},
	}
	for _, tt := range tests {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tt.tool, Arguments: tt.args})
		if err != nil {
			t.Errorf("%s %v: got protocol error %v, want a tool error", tt.tool, tt.args, err)
			continue
		}
		var text string
		if len(res.Content) > 0 {
			text = res.Content[0].(*mcp.TextContent).Text
		}
		if !res.IsError || !strings.Contains(text, tt.want) {
			t.Errorf("%s %v: got IsError %v %q, want a tool error containing %q", tt.tool, tt.args, res.IsError, text, tt.want)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("got %d calls to the daemon, want 0", n)
	}
}

func TestCapped(t *testing.T) {
	tests := []struct {
		max         int
		writes      []string
		want        string
		wantDropped int64
	}{
		{max: 5, writes: []string{"abc", "def"}, want: "abcde", wantDropped: 1},
		{max: 5, writes: []string{"abcdef", "gh"}, want: "abcde", wantDropped: 3},
		{max: 5, writes: []string{"ab"}, want: "ab"},
		{max: 0, writes: []string{"ab"}, want: "", wantDropped: 2},
	}
	for _, tt := range tests {
		c := &capped{max: tt.max}
		for _, w := range tt.writes {
			c.add([]byte(w))
		}
		if string(c.buf) != tt.want || c.dropped != tt.wantDropped {
			t.Errorf("max %d writes %q: got %q dropped %d, want %q dropped %d", tt.max, tt.writes, c.buf, c.dropped, tt.want, tt.wantDropped)
		}
	}
}
