package agent

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/sbxdev/sbx/internal/agentconn"
)

// TestDeps enforces the agent's dependency budget: it ships in every sandbox,
// so it may import only the standard library and a handful of modules.
func TestDeps(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "../../cmd/sbx-agent").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	// Each entry allows a package and the packages below it.
	allowed := []string{
		"golang.org/x/sys/unix",
		"github.com/creack/pty",
		"connectrpc.com/connect",
		"google.golang.org/protobuf",
		"github.com/sbxdev/sbx/api",
		"github.com/sbxdev/sbx/internal/agent",
		// The permission layer (FUSE) and its pure rule evaluation.
		"github.com/hanwen/go-fuse/v2",
		"github.com/sbxdev/sbx/internal/permrules",
		// The sandbox's seccomp filter, which the agent installs.
		"github.com/sbxdev/sbx/internal/seccomp",
		"github.com/sbxdev/sbx/internal/errdefs",
		// Stat-to-FileInfo for the file service (a leaf over x/sys).
		"github.com/sbxdev/sbx/internal/safepath",
		// splice(2) between sockets, pipes and files for raw file transfers.
		"github.com/sbxdev/sbx/internal/splice",
		// The accept loops' backoff (standard library only).
		"github.com/sbxdev/sbx/internal/connlimit",
		// The box user namespace helper the daemon runs the agent binary as.
		"github.com/sbxdev/sbx/internal/idmap",
		// idmap's throwaway threads (a leaf over x/sys).
		"github.com/sbxdev/sbx/internal/osthread",
		"github.com/sbxdev/sbx/cmd/sbx-agent",
		// The kubernetes driver's in-pod firewall (`sbx-agent sbx-firewall`),
		// run once by an init container before any box code, never by the
		// serving agent: nftables over netlink.
		"github.com/sbxdev/sbx/internal/podfw",
		"github.com/google/nftables",
		"github.com/mdlayher/netlink",
		"github.com/mdlayher/socket",
		"golang.org/x/net/bpf",
		"golang.org/x/sync/errgroup",
	}
	for _, pkg := range strings.Fields(string(out)) {
		ok := false
		for _, a := range allowed {
			if pkg == a || strings.HasPrefix(pkg, a+"/") {
				ok = true
				break
			}
		}
		if !ok {
			t.Errorf("sbx-agent depends on %s, which is outside its dependency budget", pkg)
		}
	}
}

// TestReadyByte checks the agent and the daemon agree on the ready signal,
// which each defines on its own to keep the agent's imports small.
func TestReadyByte(t *testing.T) {
	if ReadyByte != agentconn.ReadyByte {
		t.Errorf("agent's ReadyByte %q, daemon's %q", ReadyByte, agentconn.ReadyByte)
	}
}
