// Package runtime owns the runtime.Driver contract: the interface every
// isolation technology (oci with runc/crun/runsc, later microvm and
// kubernetes) implements so that internal/sandbox can run sandboxes without
// knowing how. Drivers live in runtime/<name>/ and never import each other;
// runtime/testsuite is the conformance suite each of them (and the fake) passes.
// It also holds what every driver hands a box's agent (AgentFiles).
package runtime

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/idmap"
)

// Driver starts and stops boxes whose PID 1 is sbx-agent. It is the whole
// contract between the sandbox manager and an isolation technology:
//
//   - Create builds every host resource for the box (rootfs, cgroup,
//     namespaces, ...), starts it with the agent as init, and returns only once
//     the agent serves: a Dial after it returns reaches an agent that answers.
//     The agent is the daemon's own build, so the caller need not say Hello
//     first. On any error nothing of the box is left behind: Create rolls back
//     what it made.
//   - The returned Handle is persisted by the caller (SQLite) verbatim. After a
//     daemon restart the caller passes it to Recover, which either re-attaches
//     (the box is running or paused and its agent is reachable) or returns an
//     error wrapping errdefs.ErrNotFound after cleaning up whatever is left,
//     or, for a handle of a newer format (see Handle), an error wrapping
//     ErrHandleVersion, touching nothing.
//   - Pause freezes every process of the box; Resume thaws it. Both are
//     idempotent.
//   - Destroy kills every process, releases every host resource (mounts,
//     cgroups, namespaces, directories, state files) and is idempotent: a
//     second call, or a call for a box that never fully existed, returns nil.
//     Destroys of different boxes may run concurrently.
//   - Cleanup removes host resources of boxes whose ids are not in keep — the
//     leftovers of a crash in the middle of Create or Destroy. The daemon calls
//     it once at start, after Recover.
//   - Dial connects to the agent of a running box.
//
// All methods are safe for concurrent use on different ids. Calls for the
// same id are serialised by the caller, except the read-only ones: Stats,
// Dial, ExecDialer.DialExec and the Prober's may run at any time, also
// during a Pause or Destroy of that box, so they change nothing and fail
// cleanly (an error, never a hang past ctx or a half-made resource) when
// the box is gone or going. Keep no per-box state in memory: everything
// follows from the id and the handle.
type Driver interface {
	Name() string
	// Info reports capabilities and health. Cheap; may be called often.
	Info(ctx context.Context) Info
	Create(ctx context.Context, spec Spec) (Handle, error)
	Recover(ctx context.Context, h Handle) (Handle, error)
	Pause(ctx context.Context, h Handle) error
	Resume(ctx context.Context, h Handle) error
	Destroy(ctx context.Context, h Handle) error
	Stats(ctx context.Context, h Handle) (Stats, error)
	Dial(ctx context.Context, h Handle) (net.Conn, error)
	Cleanup(ctx context.Context, keep map[string]bool) error
}

// ExecDialer is implemented by drivers whose agents also serve the framed
// exec protocol (api/execframe) on a socket of their own. DialExec
// returns an error wrapping errors.ErrUnsupported for a box whose agent has
// no such socket (one started by an older daemon): callers then use Exec.
type ExecDialer interface {
	DialExec(ctx context.Context, h Handle) (net.Conn, error)
}

// Resources are hard limits. Zero means "no limit" for the driver; the
// sandbox manager fills in defaults before calling Create.
type Resources struct {
	MemoryBytes int64
	CPUMillis   int64
	Pids        int64
	DiskBytes   int64
}

// Handle identifies a box to its driver. Drivers may keep private state in
// Data; the caller persists the whole Handle and hands it back, possibly to
// a newer or older build of the driver (a daemon upgrade or rollback).
// Data is therefore versioned: a JSON object whose "v" field names the
// driver's format (none: version 0, before handles carried versions). A
// driver reads every version it ever wrote and refuses newer ones with
// ErrHandleVersion (DecodeHandle does both): Recover then leaves the box
// alone, and the manager keeps its record for a daemon that understands
// it. Destroy still tears the box down, by its id alone if need be.
type Handle struct {
	ID     string `json:"id"`
	Driver string `json:"driver"`
	// Data is driver-private state, persisted by the caller.
	Data []byte `json:"data,omitempty"`
}

// Stats are live resource usage figures; a driver that cannot measure one
// leaves it zero.
type Stats struct {
	MemoryBytes     int64
	MemoryPeakBytes int64
	CPUUsageNs      int64
	Pids            int64
	DiskUsedBytes   int64
	// OOMKills counts processes killed for exceeding the memory limit.
	OOMKills int64
	// PidsLimitHits counts forks that failed on the box's PID limit.
	PidsLimitHits int64
}

// Info is a driver's self-description.
type Info struct {
	Name string
	// Healthy is false when the driver cannot create boxes at all.
	Healthy bool
	// Detail explains the health state or any fallback made, for humans.
	Detail string
	// Capabilities lists the optional features the driver has and the
	// properties callers must respect (see Capability).
	Capabilities []Capability
	// StoredIDs is the driver's uid mapping of stored trees: every tree a
	// box of this driver sees (image layers, codebases, volumes, its
	// writable layer) holds box uid (and gid) u as host id StoredIDs.Base+u,
	// for u < StoredIDs.Size, whatever range the box itself runs in. The
	// image, codebase and volume stores take it from the drivers (the
	// daemon wires it: StoredIDsOf) instead of assuming one driver's; the
	// drivers of one daemon share those stores, so they must agree. Zero for
	// a driver that shows boxes host ids unshifted (the fake).
	StoredIDs idmap.Range
}

// StoredIDsOf returns the stored-tree mapping (Info.StoredIDs) every
// driver in infos uses, or an error wrapping errdefs.ErrFailedPrecondition
// naming the two that disagree: one daemon's stores hold trees for all its
// drivers. Drivers reporting a zero mapping are skipped; if all do, the
// result is zero.
func StoredIDsOf(infos ...Info) (idmap.Range, error) {
	var got idmap.Range
	from := ""
	for _, i := range infos {
		if i.StoredIDs == (idmap.Range{}) {
			continue
		}
		if from != "" && i.StoredIDs != got {
			return got, fmt.Errorf("runtimes %q and %q store trees in different uid ranges (%v and %v): one daemon cannot serve both: %w",
				from, i.Name, got, i.StoredIDs, errdefs.ErrFailedPrecondition)
		}
		got, from = i.StoredIDs, i.Name
	}
	return got, nil
}

// ProbeTimeout bounds how long drivers wait for an agent to come up.
const ProbeTimeout = 10 * time.Second

// LimitEvents are a box's running counts of its limits biting, for telling
// a command's end apart (see LimitEventer).
type LimitEvents struct {
	// OOMKills counts processes the memory limit killed.
	OOMKills int64
	// PidsLimitHits counts forks the pids limit refused.
	PidsLimitHits int64
}

// LimitEventer is implemented by drivers that can read a box's LimitEvents
// cheaply (a few cgroup files), so the daemon can read them as each exec
// starts and ends and say whether its limits bit during the exec. Counts
// only grow; a driver that cannot count one kind leaves it zero.
type LimitEventer interface {
	LimitEvents(ctx context.Context, h Handle) (LimitEvents, error)
}

// Updater is implemented by drivers that can change a running box's limits
// (used to hand warm, pre-started boxes to sandboxes that asked for other
// limits). Update applies every field of r; it fails, changing nothing it can
// avoid changing, when a new limit is below current usage.
type Updater interface {
	Update(ctx context.Context, h Handle, r Resources) error
}

// Snapshotter is implemented by drivers that can export a box's writable
// layer. Diff writes it to w as an uncompressed OCI layer tar: regular
// files, directories, symlinks and hardlinks within the layer, deletions as
// ".wh.NAME" whiteouts and opaque directories as ".wh..wh..opq", owners as
// seen inside the box. The box is frozen while the tar is written (unless it
// already was) and thawed afterwards; it works on running and paused boxes.
// Per-box files the driver itself writes into the layer (hostname, hosts,
// the agent's mount point) are left out.
//
// The layer is written by the box, so Diff treats it as hostile: it never
// follows a symlink in it, keeps holes as holes (a file's holes and runs of
// zeros are not copied as data: the oci driver writes PAX GNU sparse 1.0
// entries), and stops with errdefs.ErrResourceExhausted, naming the limit,
// once the layer's data passes lim.DataBytes or its apparent size (files
// with their holes, plus tar headers) passes lim.ApparentBytes.
type Snapshotter interface {
	Diff(ctx context.Context, h Handle, w io.Writer, lim DiffLimits) error
}

// DiffLimits bound what Snapshotter.Diff copies out of a box. Zero fields
// are unbounded.
type DiffLimits struct {
	// DataBytes bounds the bytes of file data (holes and zero runs not
	// counted): the box's own disk limit.
	DataBytes int64
	// ApparentBytes bounds the layer as a reader of the tar sees it: the
	// sum of file sizes, holes included, and of tar headers (a daemon-wide
	// cap, `sbx serve --max-layer-size`).
	ApparentBytes int64
	// DataWhat and ApparentWhat name the limits in errors ("sandbox
	// sb-1's disk limit"); "" gives a generic name.
	DataWhat, ApparentWhat string
}

// Watcher is implemented by drivers that can tell when a box's init (the
// agent) ends on its own — killed from the host, OOM-killed, crashed — so the
// caller can stop calling the box running (attack class 5: a box that is
// running but cannot exec is a bug). Watch returns a channel that receives
// one Exit when the init of box h is gone and is then closed; if it is gone
// already (it died while the daemon was down), the Exit is in the channel
// when Watch returns, so a non-blocking receive right after Watch tells. The
// watch ends, the channel closed without an Exit, once ctx is done; Destroy
// ends it too (the init's death is then no news: the caller destroyed it).
// Watching must not cost a busy loop per box: the oci driver parks one
// goroutine per box on a pidfd in Go's netpoller (epoll), holding no thread.
// Watch fails with an error wrapping errors.ErrUnsupported for a box whose
// handle does not say which process is its init.
type Watcher interface {
	Watch(ctx context.Context, h Handle) (<-chan Exit, error)
}

// Killer is implemented by drivers that can stop every process of a box at
// once and cheaply (one signal, no runtime invocation), ahead of Destroy,
// which then releases what the box held. The manager kills a destroyed box
// before it queues the teardown, so the queue of boxes waiting to be torn
// down may be long without holding running code (teardown.go). Kill of a
// box whose processes are gone already is no error; a box killed this way
// is not restarted by anything, and Watch reports its init's death as for
// any other (the manager ignores it for a box it is destroying).
type Killer interface {
	Kill(ctx context.Context, h Handle) error
}

// Exit says how a box's init ended.
type Exit struct {
	// Reason is for humans and names what happened: "OOM-killed (SIGKILL)",
	// "killed by signal SIGKILL", "exited with status 2", or why it is not
	// known ("exited; status unknown: ...").
	Reason string
	// Signal is the number of the signal that killed the init (0 if it
	// exited or is not known).
	Signal int
	// OOMKilled is set when the box's own OOM-kill count (the agent's, not
	// user code's) rose while the init was watched.
	OOMKilled bool
}
