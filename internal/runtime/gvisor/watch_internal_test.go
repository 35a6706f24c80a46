//go:build linux

package gvisor

import (
	"testing"

	"github.com/sbxdev/sbx/internal/pidwatch"
	"github.com/sbxdev/sbx/internal/runtime"
)

// TestSandboxExit: runsc's sandbox process exits with 128+N when signal N
// killed the box's init, so that is what the agent's death is reported as;
// the sandbox process killed itself, or runsc failing (128), says so.
func TestSandboxExit(t *testing.T) {
	for _, tc := range []struct {
		st   pidwatch.Status
		want runtime.Exit
	}{
		{pidwatch.Status{Code: 137}, runtime.Exit{Reason: "killed by signal SIGKILL", Signal: 9}},
		{pidwatch.Status{Code: 143}, runtime.Exit{Reason: "killed by signal SIGTERM", Signal: 15}},
		{pidwatch.Status{Code: 2}, runtime.Exit{Reason: "exited with status 2"}},
		{pidwatch.Status{Code: 0}, runtime.Exit{Reason: "exited with status 0"}},
		{pidwatch.Status{Code: 128}, runtime.Exit{Reason: "died with its gVisor sandbox process (runsc failed, status 128; see runsc.log)"}},
		{pidwatch.Status{Code: 255}, runtime.Exit{Reason: "exited with status 255"}},
		{pidwatch.Status{Signal: 9}, runtime.Exit{Reason: "died with its gVisor sandbox process, killed by signal SIGKILL", Signal: 9}},
		{pidwatch.Status{Unknown: "gone"}, runtime.Exit{Reason: "gone"}},
	} {
		if got := sandboxExit(tc.st); got != tc.want {
			t.Errorf("sandboxExit(%+v) = %+v, want %+v", tc.st, got, tc.want)
		}
	}
}
