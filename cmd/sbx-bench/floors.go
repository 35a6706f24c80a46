package main

import (
	"connectrpc.com/connect"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/agentconn"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// The floors of our own design, measured so that a run shows what is left
// above them (see docs/ARCHITECTURE.md, known limits):
//
//   - sandboxRuncBundles runs /usr/bin/true under the sandbox's own config.json
//     (user namespace, seccomp allowlist, cgroup limits, masked paths, every
//     mount), on its rootfs: what the OCI runtime costs with our hardening,
//     before the agent starts. The same without the seccomp profile shows
//     what compiling it costs in the runtime.
//   - benchAgentExec runs `true` through the sandbox's agent sockets
//     directly, without the daemon: the agent's fork/exec/wait plus one
//     framed exchange; the API's `exec true` adds the client→daemon hop.

// boxBundle is where the oci driver keeps sandbox id's OCI bundle under the
// daemon's data dir.
func boxBundle(dataDir, id string) string {
	return filepath.Join(dataDir, "oci", "boxes", id, "bundle")
}

// sandboxRuncBundles writes two bundles running /usr/bin/true with sandbox
// id's config and rootfs: as is, and without its seccomp profile (noSeccomp
// is "" when the config has none: the agent installs the filter itself).
func sandboxRuncBundles(tmp, dataDir, id string) (hardened, noSeccomp string, err error) {
	bundle := boxBundle(dataDir, id)
	raw, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return "", "", fmt.Errorf("read sandbox config: %w", err)
	}
	hasSeccomp := false
	mk := func(name string, seccomp bool) (string, error) {
		var spec map[string]any
		if err := json.Unmarshal(raw, &spec); err != nil {
			return "", fmt.Errorf("parse sandbox config: %w", err)
		}
		spec["root"] = map[string]any{"path": filepath.Join(bundle, "rootfs")}
		proc, _ := spec["process"].(map[string]any)
		linux, _ := spec["linux"].(map[string]any)
		if proc == nil || linux == nil {
			return "", fmt.Errorf("sandbox config has no process or linux section")
		}
		proc["args"] = []string{"/usr/bin/true"}
		linux["cgroupsPath"] = "/sbx-bench-" + name
		// The box's config starts it at the most weight (the driver lowers
		// it once the agent is ready); at the root that would outweigh the
		// host: run the floor at a host process's weight.
		if res, ok := linux["resources"].(map[string]any); ok {
			if cpu, ok := res["cpu"].(map[string]any); ok {
				cpu["shares"] = 1024
			}
		}
		_, hasSeccomp = linux["seccomp"]
		if !seccomp {
			delete(linux, "seccomp")
		}
		dir := filepath.Join(tmp, "runc-"+name)
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return "", err
		}
		b, err := json.Marshal(spec)
		if err != nil {
			return "", err
		}
		return dir, os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600)
	}
	if hardened, err = mk("hardened", true); err != nil || !hasSeccomp {
		return hardened, "", err
	}
	noSeccomp, err = mk("noseccomp", false)
	return hardened, noSeccomp, err
}

// runcRunner returns a function making tasks that `runc run` a bundle
// (or runtimeBin's run, as the driver runs it: runtimeRunner) in the
// foreground, each under a new container id.
func runcRunner(runtimeBin, root string) func(bundle string) func() error {
	if runtimeBin == "" {
		runtimeBin = "runc"
	}
	run, err := runtimeRunner(runtimeBin, root)
	if err != nil {
		return func(string) func() error { return func() error { return err } }
	}
	return run
}

// agentExec returns a task running `exec true` over sandbox sb's agent
// sockets, without the daemon in between, the way the daemon runs the API's
// Exec (framed, see agentconn.Conn.ExecOnce), and a function closing it.
func agentExec(ctx context.Context, dataDir string, sb *sbx.Sandbox) (func() error, func()) {
	box := filepath.Dir(boxBundle(dataDir, sb.ID))
	dialer := func(name string) agentconn.DialFunc {
		return func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", filepath.Join(box, name))
		}
	}
	conn := agentconn.New(dialer("agent.sock"), agentconn.WithExecDial(dialer("exec.sock")))
	run := func() error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		st, err := conn.ExecOnce(ctx, &sbxv1.ExecRequest{Argv: []string{"true"}})
		if err != nil {
			return err
		}
		defer st.Close() //nolint:errcheck
		return exitedZero("agent exec", st)
	}
	return run, conn.Close
}

// exitedZero reads an exec's output to its exited event and fails unless
// the command exited 0.
func exitedZero(what string, st agentconn.ExecStream) error {
	for st.Receive() {
		if ex := st.Msg().GetExited(); ex != nil {
			if ex.GetExitCode() != 0 {
				return fmt.Errorf("%s: exit %d", what, ex.GetExitCode())
			}
			return nil
		}
	}
	return fmt.Errorf("%s: %w", what, st.Err())
}

// execResults are the exec measurements, taken in turns.
type execResults struct {
	api result // the SDK's Exec: the exec upgrade
	// byName and getFirst run `sbx exec NAME -- true` as the CLI does now
	// (the exec names the sandbox) and as it did before (GetSandbox,
	// measuring the box, then the exec).
	byName, getFirst result
	rpc              result // the Exec RPC over gRPC
	agent            result // straight through the agent's sockets
	local            result // fork+exec of /bin/true here
}

// benchExec measures `exec true` through the API (the SDK's path, the exec
// upgrade, and the Exec RPC over gRPC), the same straight through the
// agent's sockets, and a local fork+exec of /bin/true, taking turns.
func benchExec(ctx context.Context, c *sbx.Client, dataDir string, sb *sbx.Sandbox, n int) (execResults, error) {
	var r execResults
	viaAgent, closeAgent := agentExec(ctx, dataDir, sb)
	defer closeAgent()
	viaAPI := func() error {
		res, err := sb.Run(ctx, "true")
		if err == nil && res.Code != 0 {
			err = fmt.Errorf("exit %d", res.Code)
		}
		return err
	}
	ref := sb.Name
	if ref == "" {
		ref = sb.ID
	}
	byName := func() error {
		res, err := c.Sandbox(ref).Run(ctx, "true")
		if err == nil && res.Code != 0 {
			err = fmt.Errorf("exit %d", res.Code)
		}
		return err
	}
	getFirst := func() error {
		got, err := c.Get(ctx, ref)
		if err != nil {
			return err
		}
		res, err := got.Run(ctx, "true")
		if err == nil && res.Code != 0 {
			err = fmt.Errorf("exit %d", res.Code)
		}
		return err
	}
	viaRPC := func() error {
		st, err := c.API().Exec(ctx, connect.NewRequest(&sbxv1.ExecRequest{Sandbox: sb.ID, Argv: []string{"true"}}))
		if err != nil {
			return err
		}
		defer st.Close() //nolint:errcheck
		return exitedZero("exec rpc", st)
	}
	for _, f := range []func() error{viaAPI, byName, getFirst, viaRPC, viaAgent} { // warm the connections
		if err := f(); err != nil {
			return r, err
		}
	}
	rs, err := measureTogether(n,
		task{"sbx exec true (API round trip)", viaAPI},
		task{"  by name, as `sbx exec NAME` now", byName},
		task{"  by name, GetSandbox first (before)", getFirst},
		task{"  the same over the gRPC Exec RPC", viaRPC},
		task{"exec true, agent socket (no daemon)", viaAgent},
		task{"fork+exec /bin/true", func() error { return exec.Command("/bin/true").Run() }},
	)
	if err != nil {
		return r, err
	}
	return execResults{api: rs[0], byName: rs[1], getFirst: rs[2], rpc: rs[3], agent: rs[4], local: rs[5]}, nil
}
