//go:build linux

package gvisor

import (
	"bytes"
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/agentconn"
	"github.com/sbxdev/sbx/internal/cleanup"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/hostimage"
	"github.com/sbxdev/sbx/internal/hostmount"
	"github.com/sbxdev/sbx/internal/idmap"
	"github.com/sbxdev/sbx/internal/overlay"
	"github.com/sbxdev/sbx/internal/pidwatch"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/ocibox"
)

// Driver runs boxes under runsc. Like the oci driver it keeps no per-box
// state in memory: everything follows from the box id.
type Driver struct {
	stateDir  string
	boxesDir  string
	runscRoot string
	imagesDir string
	runsc     string
	// agent is the daemon's agent binary, copied once per build under the
	// state dir and bind-mounted read-only into every box.
	agent    string
	cgParent string
	// cpuShares is the parent cgroup's CPU weight (Config.BoxesCPUShares).
	cpuShares uint64
	platform  string
	// agentSeccomp: the agent installs the seccomp profile, not runsc
	// (seccomp_linux.go).
	agentSeccomp bool
	// caps are capabilities plus network with Config.Network.
	caps    []runtime.Capability
	healthy bool
	detail  string
	log     *slog.Logger
}

var _ runtime.Driver = (*Driver)(nil)

// New prepares StateDir and finds runsc. A missing or unusable runsc makes
// an unhealthy driver (it says why in Info), not an error: the daemon still
// serves its other runtimes.
func New(cfg Config) (*Driver, error) {
	if cfg.StateDir == "" || !filepath.IsAbs(cfg.StateDir) {
		return nil, fmt.Errorf("gvisor: state dir %q must be absolute: %w", cfg.StateDir, errdefs.ErrInvalidArgument)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	d := &Driver{
		stateDir:  filepath.Clean(cfg.StateDir),
		boxesDir:  filepath.Join(cfg.StateDir, "boxes"),
		runscRoot: filepath.Join(cfg.StateDir, "runsc"),
		imagesDir: filepath.Join(cfg.StateDir, "images"),
		cgParent:  cfg.CgroupParent,
		platform:  cfg.Platform,
		cpuShares: cfg.BoxesCPUShares,
		log:       log.With("driver", name),
		caps:      capabilities,
	}
	if cfg.Network {
		d.caps = append(slices.Clone(capabilities), runtime.CapNetwork)
	}
	var err error
	if d.agentSeccomp, err = agentSeccomp(); err != nil {
		return nil, err
	}
	if d.cgParent == "" {
		d.cgParent = defaultCgroupParent
	}
	if !validCgroupParent.MatchString(d.cgParent) {
		return nil, fmt.Errorf("gvisor: cgroup parent %q: %w", d.cgParent, errdefs.ErrInvalidArgument)
	}
	if d.cpuShares == 0 {
		d.cpuShares = ocibox.DefaultBoxesCPUShares
	}
	if d.cpuShares < 2 || d.cpuShares > 262144 {
		return nil, fmt.Errorf("gvisor: boxes' cpu shares %d: want 2 to 262144: %w", d.cpuShares, errdefs.ErrInvalidArgument)
	}
	if d.platform == "" {
		d.platform = "systrap"
	}
	for _, dir := range []string{d.stateDir, d.boxesDir, d.runscRoot} {
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return nil, fmt.Errorf("gvisor: create %s: %w", dir, err)
		}
	}
	if d.agent, err = installAgent(cfg.AgentPath, filepath.Join(d.stateDir, "agent")); err != nil {
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	path := cfg.RunscPath
	if path == "" {
		path = "runsc"
	}
	if d.runsc, err = exec.LookPath(path); err != nil {
		d.detail = fmt.Sprintf("runsc not found (%v); scripts/install-runsc.sh builds it", err)
		return d, nil
	}
	d.healthy, d.detail = true, "runsc "+runscVersion(d.runsc)+" ("+d.runsc+", platform "+d.platform+")"
	return d, nil
}

// runscVersion is the gVisor module version runsc was built from (runsc
// built with `go install` says VERSION_MISSING itself).
func runscVersion(path string) string {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return "(unknown version)"
	}
	if bi.Main.Path == "gvisor.dev/gvisor" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	for _, m := range bi.Deps {
		if m.Path == "gvisor.dev/gvisor" {
			return m.Version
		}
	}
	return "(unknown version)"
}

// installAgent copies the agent binary to dir/<sha256 prefix>/sbx-agent
// once per build and returns that path; running boxes keep the copy they
// were started with.
func installAgent(src, dir string) (string, error) {
	if src == "" {
		return "", fmt.Errorf("agent path not set: %w", errdefs.ErrInvalidArgument)
	}
	f, err := os.Open(src)
	if err != nil {
		return "", fmt.Errorf("install agent: %w", err)
	}
	h := sha256.New()
	_, err = io.Copy(h, f)
	f.Close()
	if err != nil {
		return "", fmt.Errorf("install agent: read %s: %w", src, err)
	}
	final := filepath.Join(dir, hex.EncodeToString(h.Sum(nil))[:24])
	bin := filepath.Join(final, "sbx-agent")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return "", fmt.Errorf("install agent: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, ".tmp-")
	if err != nil {
		return "", fmt.Errorf("install agent: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("install agent: %w", err)
	}
	if err := hostimage.CopyFile(src, filepath.Join(tmp, "sbx-agent"), 0o755); err != nil {
		return "", fmt.Errorf("install agent: %w", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		if _, serr := os.Stat(bin); serr == nil {
			return bin, nil
		}
		return "", fmt.Errorf("install agent: %w", err)
	}
	return bin, nil
}

func (d *Driver) Name() string { return name }

func (d *Driver) Info(context.Context) runtime.Info {
	return runtime.Info{Name: name, Healthy: d.healthy, Detail: d.detail, Capabilities: d.caps,
		StoredIDs: idmap.Canonical}
}

// Close unmounts the empty network namespace runsc keeps in its root for
// --network=none boxes (running boxes hold their own reference) and
// removes the parent cgroup if no box is left in it.
func (d *Driver) Close() error {
	removeCgroupParent(d.cgParent)
	return hostmount.Unmount(filepath.Join(d.runscRoot, "null-netns"))
}

var validCgroupParent = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9_.-]*$`)

func checkID(id string) error { return ocibox.CheckID(id) }

// Paths of a box.
func (d *Driver) boxDir(id string) string { return filepath.Join(d.boxesDir, id) }
func rwDir(box string) string             { return filepath.Join(box, "rw") }
func rootfsDir(box string) string         { return filepath.Join(box, "rootfs") }
func runDir(box string) string            { return filepath.Join(box, "run") }
func mntDir(box string) string            { return filepath.Join(box, "mnt") }
func sockPath(box string) string          { return filepath.Join(runDir(box), "agent.sock") }
func execSock(box string) string          { return filepath.Join(runDir(box), "exec.sock") }

// The daemon's own links to the agent's sockets, in the box dir, which the
// box cannot reach (pinSockets).
func agentLink(box string) string { return filepath.Join(box, "agent.sock") }
func execLink(box string) string  { return filepath.Join(box, "exec.sock") }
func agentLog(box string) string  { return filepath.Join(box, "agent.log") }
func runscLog(box string) string  { return filepath.Join(box, "runsc.log") }

// The agent's sockets as the box sees them (runDir is bound there).
const (
	runInBox   = "/.sbx/run"
	agentInBox = ocibox.AgentInBox
)

// handleVersion is the version of handleData Create writes
// (runtime.DecodeHandle); the driver has written only 1. Everything else
// follows from the box id.
const handleVersion = 1

// handleData is the driver-private part of a Handle: a version, so a newer
// daemon can tell how an older one made the box, and runsc's host processes
// (see watch_linux.go); boxes made before they were recorded have neither.
type handleData struct {
	Version int `json:"v"`
	// Sandbox is runsc's sandbox process, which exits with the agent.
	Sandbox procRef `json:"sandbox,omitzero"`
	// Children are the runsc processes (sandbox, gofer) that were this
	// daemon's children at create, for Destroy to reap.
	Children []procRef `json:"children,omitempty"`
}

// parseHandle reads h's driver data; an unreadable one reads as empty (a
// box made before anything was recorded).
func parseHandle(h runtime.Handle) handleData {
	data, _, _ := runtime.DecodeHandle[handleData](h, handleVersion)
	return data
}

func (d *Driver) Create(ctx context.Context, spec runtime.Spec) (h runtime.Handle, err error) {
	if !d.healthy {
		return h, fmt.Errorf("gvisor: %s: %w", d.detail, errdefs.ErrUnavailable)
	}
	if err := checkID(spec.ID); err != nil {
		return h, err
	}
	if err := spec.Validate(); err != nil {
		return h, err
	}
	if err := checkNetwork(spec.Network); err != nil {
		return h, err
	}
	lowers, hostImage, err := d.lowers(spec.Image)
	if err != nil {
		return h, err
	}
	var undo cleanup.Stack
	defer func() {
		if err != nil {
			if uerr := undo.Run(); uerr != nil {
				d.log.Warn("rolling back box", "id", spec.ID, "err", uerr)
			}
		}
	}()
	box, err := ocibox.MakeBoxDir(d.boxesDir, spec.ID, &undo, d.removeBoxDir, execSock(d.boxDir(spec.ID)))
	if err != nil {
		return h, err
	}

	root := int(idmap.Canonical.Base)
	upper, work, err := ocibox.WritableLayer(rwDir(box), spec.Resources.DiskBytes, root, &undo)
	if err != nil {
		return h, err
	}
	rootfs := rootfsDir(box)
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return h, fmt.Errorf("create rootfs dir: %w", err)
	}
	if err := overlay.Mount(rootfs, lowers, upper, work, "", 0); err != nil {
		return h, fmt.Errorf("mount rootfs: %w", err)
	}
	undo.Add(func() error { return hostmount.Unmount(rootfs) })
	if err := prepareRootfs(rootfs, spec, root, d.log); err != nil {
		return h, err
	}
	// /tmp lives on the box's disk too (see mounts).
	tmp, err := boxTmp(rootfs, root)
	if err != nil {
		return h, err
	}
	run := runDir(box)
	if err := os.Mkdir(run, 0o700); err != nil {
		return h, fmt.Errorf("create run dir: %w", err)
	}
	if err := os.Chown(run, root, root); err != nil {
		return h, fmt.Errorf("chown run dir: %w", err)
	}
	mounts, err := d.boxMounts(box, spec.Mounts, &undo)
	if err != nil {
		return h, err
	}
	ociSpec := buildSpec(spec, specParams{
		Rootfs: rootfs, HostImage: hostImage, Agent: d.agent, RunDir: run, TmpDir: tmp, Mounts: mounts,
		CgroupsPath: "/" + d.cgParent + "/" + spec.ID, AgentSeccomp: d.agentSeccomp,
	})
	cfgJSON, err := json.Marshal(ociSpec)
	if err != nil {
		return h, fmt.Errorf("encode oci spec: %w", err)
	}
	if err := os.WriteFile(filepath.Join(box, "config.json"), cfgJSON, 0o600); err != nil {
		return h, fmt.Errorf("write oci spec: %w", err)
	}
	// Before runsc makes the parent with the default weight (1024: all
	// gvisor boxes together as much as a busy host process, eight times
	// what oci's boxes get, the daemon's threads left to compete with them).
	if dir, v2, ok := ocibox.CPUParentDir(d.cgParent); ok {
		if err := ocibox.SetBoxesCPUWeight(dir, v2, d.cpuShares); err != nil {
			return h, err
		}
	}
	var procs []procRef
	undo.Add(func() error {
		return errors.Join(d.teardown(context.WithoutCancel(ctx), spec.ID), reapChildren(procs))
	})
	err = d.start(ctx, spec.ID, box, runscNetwork(spec.Network))
	sandbox, procs := d.runscProcs(spec.ID, box)
	if err != nil {
		return h, err
	}
	if err := pinSockets(box); err != nil {
		return h, err
	}
	raw, _ := json.Marshal(handleData{Version: handleVersion, Sandbox: sandbox, Children: procs})
	return runtime.Handle{ID: spec.ID, Driver: name, Data: raw}, nil
}

// lowers returns the image's lower dirs, lowest first, and whether the
// host's /usr is to be bound over the host image's.
func (d *Driver) lowers(img runtime.Image) ([]string, bool, error) {
	return ocibox.Lowers(d.imagesDir, img, int(idmap.Canonical.Base))
}

// boxMounts turns the spec's mounts into binds runsc's gofer serves:
// volumes' and files' dirs as they are (runsc's user namespace shows their
// stored owners), codebases' overlays mounted on the host under the box
// dir first, as the box's root would see them.
func (d *Driver) boxMounts(box string, ms []runtime.Mount, undo *cleanup.Stack) ([]ocibox.Bind, error) {
	out := make([]ocibox.Bind, 0, len(ms))
	for i, m := range ms {
		b := ocibox.Bind{Destination: m.Destination, ReadOnly: m.ReadOnly}
		switch {
		case m.Volume != nil:
			b.Source = m.Volume.Dir
		case m.Files != nil:
			b.Source = m.Files.Dir
		case m.Codebase != nil:
			target := filepath.Join(mntDir(box), strconv.Itoa(i))
			if err := os.MkdirAll(target, 0o700); err != nil {
				return nil, fmt.Errorf("create mount point for %s: %w", m.Destination, err)
			}
			c := m.Codebase
			if err := overlay.Mount(target, []string{c.Lower}, c.Upper, c.Work, "", 0); err != nil {
				return nil, fmt.Errorf("mount codebase %s at %s: %w", c.Name, m.Destination, err)
			}
			undo.Add(func() error { return hostmount.Unmount(target) })
			b.Source = target
		default:
			return nil, fmt.Errorf("mount at %s: no volume, codebase or files: %w", m.Destination, errdefs.ErrInvalidArgument)
		}
		out = append(out, b)
	}
	return out, nil
}

// command is runsc with the flags every call for this driver's boxes takes.
func (d *Driver) command(ctx context.Context, args ...string) *exec.Cmd {
	return d.commandNet(ctx, "none", args...)
}

// commandNet is command with runsc's --network set to network (only `run`
// sets up a box's network: see runscNetwork).
func (d *Driver) commandNet(ctx context.Context, network string, args ...string) *exec.Cmd {
	base := []string{"--root", d.runscRoot, "--platform", d.platform, "--network", network,
		"--host-uds", "create", "--overlay2", "none", "--host-settings", "ignore"}
	if !d.agentSeccomp {
		base = append(base, "--oci-seccomp")
	}
	return exec.CommandContext(ctx, d.runsc, append(base, args...)...)
}

// run runs runsc and returns its combined output in the error.
func (d *Driver) run(ctx context.Context, args ...string) ([]byte, error) {
	cmd := d.command(ctx, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("runsc %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// start runs the box with the agent as init and waits until it serves. The
// ready pipe's write end is the agent's fd 3 (--pass-fd). network is
// runsc's --network for the box (runscNetwork).
func (d *Driver) start(ctx context.Context, id, box, network string) error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("agent ready pipe: %w", err)
	}
	defer r.Close()
	logf, err := os.OpenFile(agentLog(box), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		w.Close()
		return fmt.Errorf("create agent log: %w", err)
	}
	defer logf.Close()
	// Not killed with ctx: runsc killed in the middle of `run` leaves its
	// sandbox and gofer running with no state to delete them by. It takes
	// a fraction of a second; a cancelled create is rolled back after it.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*runtime.ProbeTimeout)
	defer cancel()
	cmd := d.commandNet(rctx, network, "--log", runscLog(box), "run", "--detach", "--pass-fd", "3:3",
		"--pid-file", sandboxPidFile(box), "--bundle", box, id)
	cmd.ExtraFiles = []*os.File{w}
	cmd.Stdout, cmd.Stderr = logf, logf // the agent's stdio too: its log
	err = cmd.Run()
	w.Close() // only the box holds it now: its exit reads as EOF
	if err != nil {
		return fmt.Errorf("runsc run: %w%s", err, logTail(agentLog(box), runscLog(box)))
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("box %s: %w", id, err)
	}
	if err := agentconn.AwaitReady(ctx, r, runtime.ProbeTimeout); err != nil {
		return fmt.Errorf("box %s: %w%s", id, err, logTail(agentLog(box), runscLog(box)))
	}
	return nil
}

// logTail returns the end of the first non-empty log for error messages.
func logTail(paths ...string) string { return ocibox.LogTail(paths...) }

// state is what `runsc state` reports.
type state struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Pid    int    `json:"pid"`
}

func (d *Driver) state(ctx context.Context, id string) (state, error) {
	var st state
	out, err := d.run(ctx, "state", id)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, fmt.Errorf("parse runsc state: %w", err)
	}
	return st, nil
}

func (d *Driver) Recover(ctx context.Context, h runtime.Handle) (runtime.Handle, error) {
	if err := checkID(h.ID); err != nil {
		return h, err
	}
	if _, _, err := runtime.DecodeHandle[handleData](h, handleVersion); errors.Is(err, runtime.ErrHandleVersion) {
		return h, err // a newer daemon's box: left alone
	}
	st, err := d.state(ctx, h.ID)
	if err == nil && (st.Status == "running" || st.Status == "paused") {
		box := d.boxDir(h.ID)
		if _, lerr := os.Lstat(agentLink(box)); errors.Is(lerr, fs.ErrNotExist) {
			// A box made before sockets were pinned: pin them now, so
			// from here on the box cannot cut the daemon off by
			// unlinking them (the files are checked to be sockets).
			if perr := pinSockets(box); perr != nil {
				d.log.Warn("pinning the agent sockets of a recovered box", "id", h.ID, "err", perr)
			}
		}
		if fi, serr := os.Lstat(agentSocket(box)); serr == nil && fi.Mode()&fs.ModeSocket != 0 {
			if data := parseHandle(h); data.Sandbox.Pid == 0 && st.Pid > 0 {
				// Made before the sandbox was recorded: record it now,
				// so this daemon watches it.
				data.Sandbox = procRef{Pid: st.Pid, Start: pidwatch.StartTime(st.Pid)}
				data.Version = handleVersion
				h.Data, _ = json.Marshal(data)
			}
			return h, nil
		}
	}
	why := "not running"
	if err != nil {
		why = err.Error()
	} else if st.Status != "" {
		why = st.Status
	}
	if derr := d.Destroy(ctx, h); derr != nil {
		d.log.Warn("removing the remains of a box", "id", h.ID, "err", derr)
	}
	return h, fmt.Errorf("box %s: %s: %w", h.ID, why, errdefs.ErrNotFound)
}

func (d *Driver) Pause(ctx context.Context, h runtime.Handle) error {
	return d.setPaused(ctx, h.ID, true)
}

func (d *Driver) Resume(ctx context.Context, h runtime.Handle) error {
	return d.setPaused(ctx, h.ID, false)
}

func (d *Driver) setPaused(ctx context.Context, id string, pause bool) error {
	if err := checkID(id); err != nil {
		return err
	}
	verb, want := "resume", "running"
	if pause {
		verb, want = "pause", "paused"
	}
	st, err := d.state(ctx, id)
	if err != nil {
		return fmt.Errorf("%s box %s: %w", verb, id, errors.Join(err, errdefs.ErrNotFound))
	}
	if st.Status == want {
		return nil
	}
	if _, err := d.run(ctx, verb, id); err != nil {
		return fmt.Errorf("%s box %s: %w", verb, id, err)
	}
	return nil
}

// events is the part of `runsc events --stats` Stats reads.
type events struct {
	Data struct {
		CPU struct {
			Usage struct {
				Total uint64 `json:"total"`
			} `json:"usage"`
		} `json:"cpu"`
		Memory struct {
			Usage struct {
				Usage uint64 `json:"usage"`
				Max   uint64 `json:"max"`
			} `json:"usage"`
		} `json:"memory"`
		Pids struct {
			Current uint64 `json:"current"`
		} `json:"pids"`
	} `json:"data"`
}

func (d *Driver) Stats(ctx context.Context, h runtime.Handle) (runtime.Stats, error) {
	var st runtime.Stats
	if err := checkID(h.ID); err != nil {
		return st, err
	}
	out, err := d.run(ctx, "events", "--stats", h.ID)
	if err != nil {
		return st, fmt.Errorf("stats of box %s: %w", h.ID, errors.Join(err, errdefs.ErrNotFound))
	}
	var ev events
	if err := json.Unmarshal(out, &ev); err != nil {
		return st, fmt.Errorf("stats of box %s: parse runsc events: %w", h.ID, err)
	}
	st.MemoryBytes = int64(ev.Data.Memory.Usage.Usage)
	st.MemoryPeakBytes = int64(ev.Data.Memory.Usage.Max)
	st.CPUUsageNs = int64(ev.Data.CPU.Usage.Total)
	st.Pids = int64(ev.Data.Pids.Current)
	st.DiskUsedBytes, _ = diskUsed(rwDir(d.boxDir(h.ID)))
	return st, nil
}

func (d *Driver) Dial(ctx context.Context, h runtime.Handle) (net.Conn, error) {
	if err := checkID(h.ID); err != nil {
		return nil, err
	}
	c, err := dialSocket(ctx, agentSocket(d.boxDir(h.ID)))
	if err != nil {
		return nil, fmt.Errorf("dial agent of box %s: %w", h.ID, err)
	}
	return c, nil
}

// DialExec connects to the agent's framed exec socket (runtime.ExecDialer).
func (d *Driver) DialExec(ctx context.Context, h runtime.Handle) (net.Conn, error) {
	if err := checkID(h.ID); err != nil {
		return nil, err
	}
	c, err := dialSocket(ctx, execSocket(d.boxDir(h.ID)))
	if err != nil {
		return nil, fmt.Errorf("dial agent exec socket of box %s: %w", h.ID, err)
	}
	return c, nil
}

// pinSockets hard-links the agent's sockets, which runsc's gofer made in the
// box's run dir, into the box dir, where the daemon dials them from then on.
// The run dir is the box's: its root can unlink the socket files there (an
// `mv /.sbx` that falls back to copy-and-delete does), which left a
// running box nobody could reach; the links are out of its reach, and a
// socket stays bound to its inode while any link to it is left. Each file
// is opened O_PATH|O_NOFOLLOW, checked to be a socket and linked by fd
// (AT_EMPTY_PATH), so a link planted in its place is never followed.
func pinSockets(box string) error {
	for _, p := range [][2]string{{sockPath(box), agentLink(box)}, {execSock(box), execLink(box)}} {
		fd, err := unix.Open(p[0], unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("pin agent socket: %w", &fs.PathError{Op: "open", Path: p[0], Err: err})
		}
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		if err == nil && st.Mode&unix.S_IFMT != unix.S_IFSOCK {
			err = fmt.Errorf("%s is not a socket (mode %#o): %w", p[0], st.Mode, errdefs.ErrFailedPrecondition)
		}
		if err == nil {
			err = unix.Linkat(fd, "", unix.AT_FDCWD, p[1], unix.AT_EMPTY_PATH)
		}
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("pin agent socket %s: %w", p[0], err)
		}
	}
	return nil
}

// agentSocket and execSocket are where the daemon dials the agent: the
// pinned links, or for a box made before sockets were pinned, the run dir.
func agentSocket(box string) string { return pinnedOr(agentLink(box), sockPath(box)) }
func execSocket(box string) string  { return pinnedOr(execLink(box), execSock(box)) }

func pinnedOr(link, run string) string {
	if _, err := os.Lstat(link); err == nil {
		return link
	}
	return run
}

// dialSocket connects to the Unix socket at path without following a
// symlink in its last component: the box's root writes the run dir (its
// gofer makes the files there on the host), so it could replace the
// agent's socket with a link to any host socket, which a plain connect
// would follow. The file is opened O_PATH|O_NOFOLLOW, checked to be a
// socket, and connected to through /proc/self/fd, which names that very
// inode.
func dialSocket(ctx context.Context, path string) (net.Conn, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("%s is not a socket (mode %#o): %w", path, st.Mode, errdefs.ErrFailedPrecondition)
	}
	var dl net.Dialer
	return dl.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
}

func (d *Driver) Destroy(ctx context.Context, h runtime.Handle) error {
	if err := checkID(h.ID); err != nil {
		return err
	}
	// A destroy cut off by its caller would leave the box half gone.
	ctx = context.WithoutCancel(ctx)
	var errs []error
	if d.healthy {
		errs = append(errs, d.teardown(ctx, h.ID))
	}
	errs = append(errs, reapChildren(parseHandle(h).Children))
	box := d.boxDir(h.ID)
	if _, err := os.Lstat(box); err == nil {
		for _, dir := range mountsUnder(box) {
			errs = append(errs, hostmount.Unmount(dir))
		}
		errs = append(errs, d.removeBoxDir(box))
	}
	return errors.Join(errs...)
}

// teardown kills the box's sandbox and deletes runsc's state for it, then
// removes what runsc leaves when it was killed mid-way (a daemon crash or
// timeout during `runsc run`): sandbox and gofer processes still in the
// box's cgroup with no state to delete them by, its lock and socket files
// in runsc's root, and the cgroup dirs.
func (d *Driver) teardown(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var errs []error
	if _, err := d.run(ctx, "delete", "--force", id); err != nil && !notExist(err) {
		errs = append(errs, err)
	}
	if err := killCgroup(ctx, d.cgParent, id); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, removeCgroups(d.cgParent, id), d.removeRunscState(id))
	return errors.Join(errs...)
}

// removeRunscState removes runsc's files for box id from its root: what
// `runsc delete` removes, left when runsc never wrote the state file.
func (d *Driver) removeRunscState(id string) error {
	left, _ := filepath.Glob(filepath.Join(d.runscRoot, id+"_sandbox:*"))
	left = append(left, filepath.Join(d.runscRoot, "runsc-"+id+".sock"))
	var errs []error
	for _, p := range left {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove runsc state: %w", err))
		}
	}
	return errors.Join(errs...)
}

// notExist reports runsc's "container does not exist" errors.
func notExist(err error) bool {
	s := err.Error()
	return strings.Contains(s, "does not exist") || strings.Contains(s, "no such file or directory")
}

// removeBoxDir removes a box dir once nothing is mounted under it: the
// rootfs and codebase overlays write through to stored trees, so removing
// files through a mount still there would change them.
func (d *Driver) removeBoxDir(box string) error {
	if left := mountsUnder(box); len(left) > 0 {
		return fmt.Errorf("box dir %s still has mounts %v; not removing it", box, left)
	}
	return os.RemoveAll(box)
}

func (d *Driver) Cleanup(ctx context.Context, keep map[string]bool) error {
	ids := map[string]bool{}
	ents, err := os.ReadDir(d.boxesDir)
	if err != nil {
		return fmt.Errorf("gvisor: list boxes: %w", err)
	}
	for _, e := range ents {
		ids[e.Name()] = true
	}
	if d.healthy {
		if out, err := d.run(ctx, "list", "--format", "json"); err == nil {
			var list []state
			if json.Unmarshal(out, &list) == nil {
				for _, s := range list {
					ids[s.ID] = true
				}
			}
		}
	}
	var errs []error
	for id := range ids {
		if keep[id] || checkID(id) != nil {
			continue
		}
		d.log.Info("removing leftover box", "id", id)
		errs = append(errs, d.Destroy(ctx, runtime.Handle{ID: id, Driver: name}))
	}
	return errors.Join(errs...)
}

// diskUsed is the space used on the filesystem at dir.
func diskUsed(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize, nil
}

// mountsUnder lists the mount points at or below dir, deepest first (none
// if mountinfo cannot be read).
func mountsUnder(dir string) []string {
	out, _ := hostmount.Under(dir)
	return out
}
