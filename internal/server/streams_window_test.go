package server

import (
	"testing"

	"github.com/sbxdev/sbx/internal/agentconn"
)

// Every file call a sandbox may have in flight can stall holding a full
// agent stream window; the agent connection's window must still leave its
// reserve for the box's other calls (see agentconn.ConnWindow).
func TestAgentWindowCoversStalledFileCalls(t *testing.T) {
	if DefaultFilesPerSandbox > agentconn.MaxStalledStreams {
		t.Fatalf("DefaultFilesPerSandbox %d is above agentconn.MaxStalledStreams %d", DefaultFilesPerSandbox, agentconn.MaxStalledStreams)
	}
	if got, limit := agentconn.MaxStalledStreams*agentconn.StreamWindow, agentconn.ConnWindow-agentconn.ReservedWindow; got > limit {
		t.Fatalf("%d stalled file calls hold %d bytes of the agent connection's window, want at most %d (ConnWindow less its reserve)",
			agentconn.MaxStalledStreams, got, limit)
	}
}
