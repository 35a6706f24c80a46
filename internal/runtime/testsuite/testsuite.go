// Package testsuite is the conformance suite of the runtime.Driver contract:
// every driver (and the fake) runs it from its own tests with Run. It also
// offers helpers (Hello, Exec, NewSpec) for driver-specific tests. Only
// _test.go files should import it.
package testsuite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/agentconn"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
)

// Config is what a driver's test hands the suite.
type Config struct {
	// NewDriver must return a new driver value over the same host state
	// every time it is called (as a daemon restart would); the suite calls
	// it once per subtest and again to simulate a restart.
	NewDriver func(t *testing.T) runtime.Driver
	// LegacyHandle, if set, rewrites a handle this driver returned into the
	// format an older daemon persisted for the same box (its Data before
	// the current version): RecoverLegacy recovers a box from it. Nil: the
	// driver never wrote an older format.
	LegacyHandle func(t *testing.T, h runtime.Handle) runtime.Handle
	// NoIsolation says the driver isolates nothing (the fake, whose
	// agents are host processes): the isolation checks are skipped. Every
	// real driver runs them.
	NoIsolation bool
	// Image, if set, is the image of the suite's boxes instead of the host
	// image (drivers without CapHostImage: kubernetes runs a preloaded
	// image with busybox and python3).
	Image *runtime.Image
	// Skip names checks the driver is known to fail, with the reason
	// (subtest names as t.Name() ends: "Isolation/NoHostServices"). Each
	// is reported as skipped with its reason, so the gap stays visible.
	Skip map[string]string
}

// spec is NewSpec with the configured image.
func (c Config) spec(prefix string) runtime.Spec {
	s := NewSpec(prefix)
	if c.Image != nil {
		s.Image = *c.Image
	}
	return s
}

// skip skips t if c.Skip names it.
func (c Config) skip(t *testing.T) {
	t.Helper()
	for name, why := range c.Skip {
		if strings.HasSuffix(t.Name(), "/"+name) {
			t.Skipf("known gap of this driver: %s", why)
		}
	}
}

// Unversioned is a Config.LegacyHandle for drivers whose version 0 had the
// same fields as today's, only no "v": it drops the version.
func Unversioned(t *testing.T, h runtime.Handle) runtime.Handle {
	t.Helper()
	var data map[string]json.RawMessage
	if err := json.Unmarshal(h.Data, &data); err != nil {
		t.Fatalf("handle data %q is not a JSON object: %v", h.Data, err)
	}
	delete(data, "v")
	out := h
	out.Data, _ = json.Marshal(data)
	return out
}

// Run runs the conformance suite. Subtests run one after another and
// destroy what they create; subtests needing a capability the driver lacks
// are skipped.
func Run(t *testing.T, c Config) {
	tests := []struct {
		name string
		cap  runtime.Capability
		fn   func(t *testing.T, d runtime.Driver, c Config)
	}{
		{"CreateHello", "", testCreateHello},
		{"Exec", "", testExec},
		{"PauseResume", "pause", testPauseResume},
		{"Stats", "stats", testStats},
		{"DestroyIdempotent", "", testDestroyIdempotent},
		{"RecoverLive", "recover", testRecoverLive},
		{"RecoverPaused", "recover", testRecoverPaused},
		{"RecoverDestroyed", "", testRecoverDestroyed},
		{"RecoverLegacy", "recover", testRecoverLegacy},
		{"RecoverNewerHandle", "recover", testRecoverNewerHandle},
		{"Cleanup", "", testCleanup},
		{"CreateFailsCleanly", "", testCreateFailsCleanly},
		{"Update", "update", testUpdate},
		{"Snapshot", runtime.CapSnapshot, testSnapshot},
		{"Isolation", "", testIsolation},
		{"MemoryBound", "", testMemoryBound},
		{"ForkBomb", runtime.CapProcessLimits, testForkBomb},
		{"DiskBound", runtime.CapDiskLimit, testDiskBound},
		{"NothingLeftAfterDestroy", "", testNothingLeftAfterDestroy},
		{"NothingLeftAfterCrash", "", testNothingLeftAfterCrash},
		{"CreateCutOffLeavesNothing", "", testCreateCutOff},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c.skip(t)
			d := c.NewDriver(t)
			if tc.cap != "" && !HasCapability(d, tc.cap) {
				t.Skipf("driver %s lacks capability %q", d.Name(), tc.cap)
			}
			tc.fn(t, d, c)
		})
	}
}

// HasCapability reports whether d advertises capability c.
func HasCapability(d runtime.Driver, c runtime.Capability) bool {
	return d.Info(context.Background()).Has(c)
}

var idSeq atomic.Int64

// NewSpec returns a spec for the host image with modest limits and a fresh id.
func NewSpec(prefix string) runtime.Spec {
	id := fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1e6, idSeq.Add(1))
	if len(id) > 32 {
		id = id[len(id)-32:]
		id = strings.TrimLeft(id, "-")
	}
	return runtime.Spec{
		ID:      id,
		Image:   runtime.Image{Ref: "host", Host: &runtime.HostImage{}},
		Env:     []string{"SBX_TEST=1"},
		Workdir: "/work",
		Resources: runtime.Resources{
			MemoryBytes: 256 << 20,
			CPUMillis:   1000,
			Pids:        512,
			DiskBytes:   64 << 20,
		},
	}
}

// Create creates a box and registers its destruction at test end.
func Create(t testing.TB, d runtime.Driver, spec runtime.Spec) runtime.Handle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := d.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create(%s): %v", spec.ID, err)
	}
	t.Cleanup(func() {
		if err := d.Destroy(context.Background(), h); err != nil {
			t.Errorf("Destroy(%s) at cleanup: %v", h.ID, err)
		}
	})
	return h
}

// Conn returns an agent client for the box.
func Conn(d runtime.Driver, h runtime.Handle) *agentconn.Conn {
	return agentconn.New(func(ctx context.Context) (net.Conn, error) { return d.Dial(ctx, h) })
}

// Hello says Hello to the box's agent.
func Hello(ctx context.Context, d runtime.Driver, h runtime.Handle) error {
	c := Conn(d, h)
	defer c.Close()
	_, err := c.Hello(ctx)
	return err
}

// ExecResult is what a command run through the agent produced.
type ExecResult struct {
	Stdout, Stderr string
	ExitCode       int32
	Signal         int32
	Error          string
}

// Exec runs argv in the box through the agent's Exec stream and collects its
// output.
func Exec(ctx context.Context, d runtime.Driver, h runtime.Handle, argv ...string) (ExecResult, error) {
	c := Conn(d, h)
	defer c.Close()
	var res ExecResult
	stream := c.Exec(ctx)
	defer stream.CloseResponse()
	if err := stream.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Start{Start: &sbxv1.ExecRequest{Argv: argv}}}); err != nil {
		return res, fmt.Errorf("send exec start: %w", err)
	}
	var stdout, stderr strings.Builder
	for {
		msg, err := stream.Receive()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("stream ended without exited event")
			}
			return res, fmt.Errorf("exec %q: %w", argv, err)
		}
		switch ev := msg.Event.(type) {
		case *sbxv1.ExecOutput_Stdout:
			stdout.Write(ev.Stdout)
		case *sbxv1.ExecOutput_Stderr:
			stderr.Write(ev.Stderr)
		case *sbxv1.ExecOutput_Exited:
			_ = stream.CloseRequest()
			res.Stdout, res.Stderr = stdout.String(), stderr.String()
			res.ExitCode, res.Signal, res.Error = ev.Exited.GetExitCode(), ev.Exited.GetSignal(), ev.Exited.GetError()
			return res, nil
		}
	}
}

// MustExec is Exec that fails the test on a transport error.
func MustExec(t testing.TB, d runtime.Driver, h runtime.Handle, argv ...string) ExecResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := Exec(ctx, d, h, argv...)
	if err != nil {
		t.Fatalf("exec %q: %v", argv, err)
	}
	return res
}

// ctxT bounds a subtest's driver calls: a minute, for drivers whose boxes
// take seconds to start and go (Kubernetes pods, three of them in
// NothingLeftAfterDestroy, on a loaded machine).
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func testCreateHello(t *testing.T, d runtime.Driver, c Config) {
	h := Create(t, d, c.spec("hello"))
	if h.ID == "" || h.Driver != d.Name() {
		t.Errorf("handle = %+v, want id set and driver %q", h, d.Name())
	}
	conn := Conn(d, h)
	defer conn.Close()
	resp, err := conn.Hello(ctxT(t))
	if err != nil {
		t.Fatalf("Hello: %v", err)
	}
	if resp.GetProtocolVersion() != agentconn.ProtocolVersion {
		t.Errorf("protocol version = %d, want %d", resp.GetProtocolVersion(), agentconn.ProtocolVersion)
	}
}

func testExec(t *testing.T, d runtime.Driver, c Config) {
	h := Create(t, d, c.spec("exec"))
	res := MustExec(t, d, h, "echo", "hello", "sbx")
	if res.Stdout != "hello sbx\n" || res.ExitCode != 0 {
		t.Errorf("echo: got stdout %q exit %d (err %q), want %q exit 0", res.Stdout, res.ExitCode, res.Error, "hello sbx\n")
	}
	res = MustExec(t, d, h, "sh", "-c", "echo oops >&2; exit 3")
	if res.Stderr != "oops\n" || res.ExitCode != 3 {
		t.Errorf("sh: got stderr %q exit %d, want %q exit 3", res.Stderr, res.ExitCode, "oops\n")
	}
}

func testPauseResume(t *testing.T, d runtime.Driver, c Config) {
	ctx := ctxT(t)
	h := Create(t, d, c.spec("pause"))
	for i := 0; i < 2; i++ { // idempotent
		if err := d.Pause(ctx, h); err != nil {
			t.Fatalf("Pause #%d: %v", i+1, err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	if err := Hello(short, d, h); err == nil {
		t.Errorf("Hello to a paused box succeeded, want it to hang")
	}
	cancel()
	for i := 0; i < 2; i++ {
		if err := d.Resume(ctx, h); err != nil {
			t.Fatalf("Resume #%d: %v", i+1, err)
		}
	}
	if res := MustExec(t, d, h, "echo", "back"); res.Stdout != "back\n" {
		t.Errorf("echo after resume: got %q, want %q", res.Stdout, "back\n")
	}
}

func testStats(t *testing.T, d runtime.Driver, c Config) {
	h := Create(t, d, c.spec("stats"))
	MustExec(t, d, h, "sh", "-c", "echo data > /tmp/f")
	st, err := d.Stats(ctxT(t), h)
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	if st.MemoryBytes <= 0 || st.Pids <= 0 || st.CPUUsageNs <= 0 {
		t.Errorf("Stats = %+v, want memory, pids and cpu > 0", st)
	}
	if HasCapability(d, "disk-limit") && st.DiskUsedBytes <= 0 {
		t.Errorf("Stats.DiskUsedBytes = %d, want > 0", st.DiskUsedBytes)
	}
}

func testDestroyIdempotent(t *testing.T, d runtime.Driver, c Config) {
	ctx := ctxT(t)
	h := Create(t, d, c.spec("destroy"))
	for i := 0; i < 2; i++ {
		if err := d.Destroy(ctx, h); err != nil {
			t.Fatalf("Destroy #%d: %v", i+1, err)
		}
	}
	if c, err := d.Dial(ctx, h); err == nil {
		c.Close()
		t.Errorf("Dial after Destroy succeeded, want an error")
	}
	// Destroying a box that never existed is fine too.
	if err := d.Destroy(ctx, runtime.Handle{ID: c.spec("never").ID, Driver: d.Name()}); err != nil {
		t.Errorf("Destroy of unknown box: %v", err)
	}
}

func testRecoverLive(t *testing.T, d runtime.Driver, c Config) {
	ctx := ctxT(t)
	h := Create(t, d, c.spec("recover"))
	d2 := c.NewDriver(t) // the daemon restarted
	h2, err := d2.Recover(ctx, h)
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if h2.ID != h.ID {
		t.Errorf("recovered id = %q, want %q", h2.ID, h.ID)
	}
	if res := MustExec(t, d2, h2, "echo", "still here"); res.Stdout != "still here\n" {
		t.Errorf("echo after recover: got %q", res.Stdout)
	}
	if err := d2.Destroy(ctx, h2); err != nil {
		t.Fatalf("Destroy through the new driver: %v", err)
	}
}

func testRecoverPaused(t *testing.T, d runtime.Driver, c Config) {
	if !HasCapability(d, "pause") {
		t.Skip("driver cannot pause")
	}
	ctx := ctxT(t)
	h := Create(t, d, c.spec("recpause"))
	if err := d.Pause(ctx, h); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	d2 := c.NewDriver(t) // the daemon restarted while the box was frozen
	h2, err := d2.Recover(ctx, h)
	if err != nil {
		t.Fatalf("Recover of a paused box: %v", err)
	}
	if err := d2.Resume(ctx, h2); err != nil {
		t.Fatalf("Resume after recover: %v", err)
	}
	if res := MustExec(t, d2, h2, "echo", "thawed"); res.Stdout != "thawed\n" {
		t.Errorf("echo after recover+resume: got %q", res.Stdout)
	}
	if err := d2.Destroy(ctx, h2); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
}

func testRecoverDestroyed(t *testing.T, d runtime.Driver, c Config) {
	ctx := ctxT(t)
	h := Create(t, d, c.spec("gone"))
	if err := d.Destroy(ctx, h); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	_, err := c.NewDriver(t).Recover(ctx, h)
	if !errdefs.IsNotFound(err) {
		t.Errorf("Recover of a destroyed box: got %v, want an error wrapping ErrNotFound", err)
	}
}

// testRecoverLegacy: a box whose handle an older daemon wrote (the
// driver's previous handle format, Config.LegacyHandle) is recovered by
// this one, works, and is destroyed through it.
func testRecoverLegacy(t *testing.T, d runtime.Driver, c Config) {
	if c.LegacyHandle == nil {
		t.Skip("the driver has no older handle format")
	}
	ctx := ctxT(t)
	h := Create(t, d, c.spec("legacy"))
	old := c.LegacyHandle(t, h)
	d2 := c.NewDriver(t) // a newer daemon started over an older one's boxes
	h2, err := d2.Recover(ctx, old)
	if err != nil {
		t.Fatalf("Recover(%s): %v", old.Data, err)
	}
	if res := MustExec(t, d2, h2, "echo", "from before"); res.Stdout != "from before\n" {
		t.Errorf("echo after recovering a legacy handle: got %+v", res)
	}
	if err := d2.Destroy(ctx, old); err != nil {
		t.Fatalf("Destroy through the legacy handle: %v", err)
	}
	if err := Hello(ctx, d2, h); err == nil {
		t.Errorf("box %s answers after Destroy through its legacy handle", h.ID)
	}
}

// testRecoverNewerHandle: a handle with a version above the driver's (a
// newer daemon made the box, then an older one started) is refused with
// runtime.ErrHandleVersion, and the box is left alone for the daemon that
// understands it.
func testRecoverNewerHandle(t *testing.T, d runtime.Driver, c Config) {
	ctx := ctxT(t)
	h := Create(t, d, c.spec("newer"))
	var data map[string]any
	if err := json.Unmarshal(h.Data, &data); err != nil {
		t.Fatalf("handle data %q is not a JSON object: %v", h.Data, err)
	}
	if _, ok := data["v"]; !ok {
		t.Fatalf("handle data %s has no version (\"v\")", h.Data)
	}
	data["v"] = 1 << 20
	newer := h
	newer.Data, _ = json.Marshal(data)
	_, err := c.NewDriver(t).Recover(ctx, newer)
	if !errors.Is(err, runtime.ErrHandleVersion) || !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Recover of a handle from a newer daemon: got %v, want ErrHandleVersion (FailedPrecondition)", err)
	}
	if err := Hello(ctx, d, h); err != nil {
		t.Errorf("box %s after a refused Recover: Hello: %v, want it left running", h.ID, err)
	}
}

func testCleanup(t *testing.T, d runtime.Driver, c Config) {
	ctx := ctxT(t)
	kept := Create(t, d, c.spec("keep"))
	doomed := Create(t, d, c.spec("doomed"))
	if err := d.Cleanup(ctx, map[string]bool{kept.ID: true}); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := Hello(short, d, doomed); err == nil {
		t.Errorf("box %s not kept but still answers after Cleanup", doomed.ID)
	}
	if err := Hello(ctx, d, kept); err != nil {
		t.Errorf("kept box %s: Hello after Cleanup: %v", kept.ID, err)
	}
}

func testCreateFailsCleanly(t *testing.T, d runtime.Driver, c Config) {
	ctx := ctxT(t)
	bad := []runtime.Spec{c.spec("badlayer"), c.spec("badid"), c.spec("nolayers"), c.spec("badmount")}
	bad[0].Image = runtime.Image{Ref: "nope", Layers: []runtime.Layer{{Dir: "/nonexistent/sbx-layer"}}}
	bad[1].ID = "Bad/ID"
	bad[2].Image = runtime.Image{Ref: "empty"}
	bad[3].Mounts = []runtime.Mount{{Destination: "/data"}} // no kind
	for _, spec := range bad {
		if h, err := d.Create(ctx, spec); err == nil {
			_ = d.Destroy(ctx, h)
			t.Errorf("Create(%+v) succeeded, want an error", spec.Image)
		}
	}
	// Nothing was left behind: the id is free and the box works.
	spec := bad[0]
	spec.Image = c.spec("").Image
	Create(t, d, spec)
	if _, err := d.Stats(ctx, runtime.Handle{ID: bad[1].ID}); err == nil && HasCapability(d, "stats") {
		t.Errorf("Stats of a never-created box succeeded")
	}
}

// testUpdate changes the limits of a running and of a paused box. Drivers
// with "disk-limit" must also bound the writable layer at the new size and
// refuse to shrink it below what is in use.
func testUpdate(t *testing.T, d runtime.Driver, c Config) {
	u, ok := d.(runtime.Updater)
	if !ok {
		t.Fatalf("driver %s advertises \"update\" but does not implement runtime.Updater", d.Name())
	}
	ctx := ctxT(t)
	spec := c.spec("update")
	h := Create(t, d, spec)
	if err := u.Update(ctx, h, runtime.Resources{}); err != nil {
		t.Fatalf("Update with nothing to change: %v", err)
	}
	grown := runtime.Resources{MemoryBytes: 2 * spec.Resources.MemoryBytes, CPUMillis: 500, Pids: 256, DiskBytes: 2 * spec.Resources.DiskBytes}
	if err := u.Update(ctx, h, grown); err != nil {
		t.Fatalf("Update(%+v): %v", grown, err)
	}
	if res := MustExec(t, d, h, "echo", "updated"); res.Stdout != "updated\n" {
		t.Errorf("echo after Update: %+v", res)
	}
	if HasCapability(d, "disk-limit") {
		// More than the old bound fits now.
		over := spec.Resources.DiskBytes>>20 + 8
		res := MustExec(t, d, h, "dd", "if=/dev/zero", "of=/tmp/fill", "bs=1M", fmt.Sprintf("count=%d", over))
		if res.ExitCode != 0 {
			t.Errorf("writing %d MiB after growing the disk to %d MiB: %+v", over, grown.DiskBytes>>20, res)
		}
		err := u.Update(ctx, h, runtime.Resources{DiskBytes: 4 << 20})
		if err == nil || !strings.Contains(err.Error(), "disk") {
			t.Errorf("Update(disk 4 MiB) with %d MiB in use: got %v, want an error about the disk limit", over, err)
		}
		if err := Hello(ctx, d, h); err != nil {
			t.Errorf("Hello after a refused Update: %v", err)
		}
		MustExec(t, d, h, "rm", "/tmp/fill")
		if err := u.Update(ctx, h, runtime.Resources{DiskBytes: 8 << 20}); err != nil {
			t.Fatalf("Update(disk 8 MiB) of an emptied box: %v", err)
		}
		res = MustExec(t, d, h, "dd", "if=/dev/zero", "of=/tmp/fill", "bs=1M", "count=16")
		if res.ExitCode == 0 || !strings.Contains(res.Stderr, "No space left on device") {
			t.Errorf("writing 16 MiB into an 8 MiB disk: %+v, want ENOSPC", res)
		}
	}
	if HasCapability(d, "pause") {
		if err := d.Pause(ctx, h); err != nil {
			t.Fatalf("Pause: %v", err)
		}
		if err := u.Update(ctx, h, spec.Resources); err != nil {
			t.Errorf("Update of a paused box: %v", err)
		}
		if err := d.Resume(ctx, h); err != nil {
			t.Fatalf("Resume: %v", err)
		}
		if err := Hello(ctx, d, h); err != nil {
			t.Errorf("Hello after updating a paused box: %v", err)
		}
	}
}
