// Package crashpoint marks the places in the daemon where a crash is most
// likely to leave half-done work (between persisting a record and touching
// the host, between tearing a box down and forgetting it), so that the
// crash-loop test (integration/crashloop_test.go) can kill the daemon
// exactly there instead of at a random moment and hoping.
//
// Hit is a no-op unless the binary is built with the build tag
// sbxcrashpoints (the integration harness builds with it; `make build` does
// not) and the daemon's environment names the point:
//
//	SBX_CRASHPOINTS=create-recorded,destroy-marked   (or "*": every point)
//	SBX_CRASHPOINT_DIR=/some/dir
//
// A goroutine reaching a named point then creates the file
// $SBX_CRASHPOINT_DIR/<point> and blocks for good; the test waits for that
// file and kill -9s the daemon. Other goroutines go on serving.
//
// Pause points are for graceful stops: a goroutine reaching a point named
// in SBX_PAUSEPOINTS (same dir) writes what it works on (a box id) to the
// file named after the point and waits there until its context ends, as a
// graceful stop ends it; the test then stops the daemon with SIGTERM and
// checks what is left (integration/pool_stop_test.go).
//
// It imports nothing from sbx and may be imported by any package.
package crashpoint

// Points lists every crash point, in the order a sandbox's life reaches them.
var Points = []string{
	"create-recorded",    // sandbox: the record is in the store (state creating), nothing on the host yet
	"create-prepared",    // sandbox: codebases mounted and network attached, the box not made
	"oci-create-rootfs",  // oci: box dir, tmpfs, overlay and spec in place, no runtime process
	"oci-create-started", // oci: the runtime started the box, its agent not yet ready
	"create-started",     // sandbox: the driver returned a running box, the record still says creating
	"create-running",     // sandbox: the record says running, the client not yet told
	"destroy-marked",     // sandbox: the record says destroying (name released), the box still runs and is in memory
	"destroy-killed",     // sandbox, background teardown: the destroy was answered, the driver destroyed the box, network and codebase mounts remain, the record too
	"destroy-unrecorded", // sandbox, background teardown: the record is gone, the teardown not yet logged
	"sync-tree",          // codebase: a sync's new revision tree is in place, not yet committed
	"sync-committed",     // codebase: the revision is committed, the client not yet told
	"session-started",    // codeexec: a session's shell runs in the box, no record of it yet
	"session-recorded",   // codeexec: the session is recorded, the client not yet told
}

// KubernetesPoints lists the kubernetes runtime's crash points, which
// replicas sharing --state kubernetes are killed at
// (integration/k8s_replica_kill_test.go); the crash loop, on the oci
// runtime, never reaches them.
var KubernetesPoints = []string{
	"k8s-create-pod", // kubernetes: the box's TLS Secret and Pod are made, the pod neither running nor its agent answering
}

// PausePoints lists every pause point.
var PausePoints = []string{
	"oci-create-starting", // oci: the runtime started the box, its agent not yet ready (the create's ctx ends the wait)
	"warm-started",        // sandbox: a refill's box is running, not yet checked (Hello) nor in the pool
}
