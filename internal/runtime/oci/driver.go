//go:build linux

package oci

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/agentconn"
	"github.com/sbxdev/sbx/internal/cleanup"
	"github.com/sbxdev/sbx/internal/crashpoint"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/hostimage"
	"github.com/sbxdev/sbx/internal/hostmount"
	"github.com/sbxdev/sbx/internal/idmap"
	"github.com/sbxdev/sbx/internal/overlay"
	"github.com/sbxdev/sbx/internal/phases"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/ocibox"
	"github.com/sbxdev/sbx/internal/seccomp"
)

// Driver runs boxes with an OCI runtime. It keeps no per-box state in memory:
// everything is derived from the box id, the box dir and the handle, so
// operations on different boxes never contend on a lock.
type Driver struct {
	stateDir  string
	boxesDir  string
	imagesDir string
	// agentLayer is the image layer holding .sbx/sbx-agent, the topmost
	// lower layer of every box (installAgentLayer).
	agentLayer string
	// nsHelper is the binary that makes boxes' user namespaces: the small
	// helper if it lies beside the agent, else the agent layer's agent
	// (nshelper_linux.go).
	nsHelper string

	rt        *ociRuntime
	cg        cgroupLayout
	detail    string
	healthy   bool
	swapLimit bool // the host can limit memory+swap
	noFile    uint64
	// files says whether struct files are a per-box cost (prepareFileTable).
	files fileTable
	// fuse: the kernel has FUSE, so every box gets a /dev/fuse of its own
	// (makeFuseDevice); without it path policies fail to mount, clearly.
	fuse bool
	caps []runtime.Capability
	// agentSeccomp: the agent installs the seccomp profile, not the runtime.
	agentSeccomp bool
	// ids hands out each box's own host id range (see package idmap).
	ids *idmap.Allocator
	// boxLimits are the per-box kernel counter limits, at most the host's.
	boxLimits idmap.Limits
	// boxesShares is the parent cgroup's CPU weight (Config.BoxesCPUShares).
	boxesShares uint64
	// boost weighs the parent for the boxes starting (startboost.go).
	boost *startBoost
	log   *slog.Logger
}

var _ runtime.Driver = (*Driver)(nil)

// handleVersion is the version of boxData Create writes
// (runtime.DecodeHandle). 0: the same fields without "v" (IDs zero in the
// oldest); 1: "v" added.
const handleVersion = 1

// boxData is the driver-private part of a Handle.
type boxData struct {
	Version int    `json:"v"`
	Runtime string `json:"runtime"`
	Pid     int    `json:"pid"`
	// StartTime (/proc/pid/stat field 22) guards against pid reuse.
	StartTime uint64 `json:"start_time"`
	Dir       string `json:"dir"`
	// IDs is the box's host uid/gid range (zero in handles of older
	// daemons: Destroy then finds it by the box dir).
	IDs idmap.Range `json:"ids"`
}

// New prepares StateDir, picks the runtime and makes this process a child
// subreaper (see the package doc).
func New(cfg Config) (*Driver, error) {
	if cfg.StateDir == "" || !filepath.IsAbs(cfg.StateDir) {
		return nil, fmt.Errorf("oci: state dir %q must be absolute: %w", cfg.StateDir, errdefs.ErrInvalidArgument)
	}
	if strings.ContainsRune(cfg.StateDir, ',') {
		// Each box's user namespace is a file under it, which the runtime
		// passes on in a comma-separated list (runc: "invalid namespace path").
		return nil, fmt.Errorf("oci: state dir %q contains ',', which the runtime cannot take in a namespace path: %w",
			cfg.StateDir, errdefs.ErrInvalidArgument)
	}
	var err error
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	d := &Driver{
		stateDir:  filepath.Clean(cfg.StateDir),
		boxesDir:  filepath.Join(cfg.StateDir, "boxes"),
		imagesDir: filepath.Join(cfg.StateDir, "images"),
		log:       log.With("driver", "oci"),
		caps: []runtime.Capability{runtime.CapPause, runtime.CapStats, runtime.CapDiskLimit, runtime.CapRecover,
			runtime.CapUpdate, runtime.CapSnapshot, runtime.CapVolumes, runtime.CapCodebases, runtime.CapHostImage,
			runtime.CapDiskInMemory, runtime.CapProcessLimits},
	}
	if cfg.Network {
		d.caps = append(d.caps, runtime.CapNetwork, runtime.CapNetworkReplug)
	}
	for _, dir := range []string{d.stateDir, d.boxesDir} {
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return nil, fmt.Errorf("oci: create %s: %w", dir, err)
		}
		if err := os.Chmod(dir, 0o711); err != nil {
			return nil, fmt.Errorf("oci: chmod %s: %w", dir, err)
		}
	}
	pool := cfg.IDPool
	if pool == (idmap.Pool{}) {
		pool = idmap.DefaultPool
	}
	if d.ids, err = idmap.NewAllocator(cfg.IDMapDir, pool); err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	if d.boxLimits, err = boxLimits(cfg.BoxLimits, d.log); err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	if err := checkSearchable(d.stateDir); err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	parent := cfg.CgroupParent
	if parent == "" {
		parent = defaultCgroupParent
	}
	if !validCgroupParent.MatchString(parent) {
		return nil, fmt.Errorf("oci: cgroup parent %q: %w", parent, errdefs.ErrInvalidArgument)
	}
	if d.cg, err = detectCgroups(parent); err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	if d.boxesShares = cfg.BoxesCPUShares; d.boxesShares == 0 {
		d.boxesShares = DefaultBoxesCPUShares
	}
	if d.boxesShares < 2 || d.boxesShares > 262144 {
		return nil, fmt.Errorf("oci: boxes' cpu shares %d: want 2 to 262144: %w", d.boxesShares, errdefs.ErrInvalidArgument)
	}
	d.boost = &startBoost{cg: d.cg, base: d.boxesShares}
	if err := d.boost.reset(); err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	var fallback string
	path := cfg.RuntimePath
	if path == "" {
		path, fallback = pickRuntime(d.cg)
	}
	if d.rt, err = newOCIRuntime(path, d.stateDir); err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	d.detail, d.healthy = fmt.Sprintf("%s (%s)", d.rt, d.rt.path), true
	if fallback != "" {
		d.detail = fallback + ", using " + d.detail
	}
	if d.rt.name == "crun" {
		hide, note, err := crunHideUnified(d.cg)
		switch {
		case err != nil:
			d.detail, d.healthy = "crun: "+err.Error()+" (configure runc instead)", false
		case hide != "":
			d.rt.hide = hide
			d.detail += "; " + note
		}
	}
	if d.agentLayer, err = installAgentLayer(cfg.AgentPath, filepath.Join(d.stateDir, "agent")); err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	d.removeUnusedAgentLayers()
	d.nsHelper = filepath.Join(d.agentLayer, agentInBox)
	if p, err := installNSHelper(cfg.AgentPath, filepath.Join(d.stateDir, "nshelper")); err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	} else if p != "" {
		d.nsHelper = p
	}
	// Where earlier versions kept the agent and the one /dev/fuse node all
	// boxes shared; boxes still running with them keep their binds.
	_ = os.RemoveAll(filepath.Join(d.stateDir, "bin"))
	_ = os.RemoveAll(filepath.Join(d.stateDir, "dev"))
	d.swapLimit = d.cg.swapAccounting()
	d.noFile = 1 << 20
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) == nil && lim.Max < d.noFile {
		d.noFile = lim.Max // raising it would need CAP_SYS_RESOURCE in the host namespace
	}
	d.files = prepareFileTable(d.log)
	if !d.files.bounded {
		d.detail += "; file table shared (" + d.files.reason + "): each box holds at most " +
			fmt.Sprintf("1/%d of fs.file-max", fileShare)
	}
	if d.fuse = hostHasFuse(); d.fuse {
		d.caps = append(d.caps, runtime.CapPathPolicies)
	} else {
		d.log.Warn("the kernel has no FUSE: path policies will not work")
	}
	if !cfg.SeccompInRuntime {
		// Compiled here once too, so that a profile the compiler refuses
		// fails the daemon's start rather than every create.
		switch _, err := seccomp.Compile(seccomp.Default()); {
		case errors.Is(err, seccomp.ErrUnsupportedArch):
			d.log.Info("the OCI runtime installs the seccomp profile", "reason", err)
		case err != nil:
			return nil, fmt.Errorf("oci: %w", err)
		default:
			d.agentSeccomp = true
		}
	}
	if err := setSubreaper(); err != nil {
		return nil, fmt.Errorf("oci: become child subreaper: %w", err)
	}
	return d, nil
}

// pickRuntime prefers crun (faster) where it can hold every limit on this
// host's cgroup layout (crunHideUnified), else runc.
func pickRuntime(cg cgroupLayout) (path, fallback string) {
	crun, err := exec.LookPath("crun")
	if err != nil {
		return "runc", "crun: not installed"
	}
	if _, _, err := crunHideUnified(cg); err != nil {
		return "runc", "crun: " + err.Error()
	}
	return crun, ""
}

// checkSearchable makes sure the mapped root can traverse to dir: the runtime
// resolves the bundle's rootfs inside the box's user namespace.
func checkSearchable(dir string) error {
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s is not searchable by others (mode %v); box roots must be reachable by the mapped uid %d: %w",
				p, fi.Mode().Perm(), idmap.DefaultPool.First, errdefs.ErrFailedPrecondition)
		}
		if p == "/" {
			return nil
		}
	}
}

// installAgentLayer makes, once per agent binary, an image layer holding
// only .sbx/sbx-agent (0755) under dir/<sha256 prefix> and returns the
// layer's path. It is every box's topmost lower layer, and the box's
// /.sbx/sbx-agent is a read-only bind of that file taken from the box's own
// overlay: the bind's root in the box's mountinfo is then /.sbx/sbx-agent
// on "overlay", not a host path under the data dir. Layers are never
// changed once made (overlayfs forbids changing a lower under a mount), so
// a new agent binary gets a new layer and running boxes keep theirs;
// layers no box uses are removed at start (removeUnusedAgentLayers).
func installAgentLayer(src, dir string) (string, error) {
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
	layer := filepath.Join(dir, hex.EncodeToString(h.Sum(nil))[:24])
	if _, err := os.Stat(filepath.Join(layer, agentInBox)); err == nil {
		return layer, nil
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return "", fmt.Errorf("install agent: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, ".tmp-")
	if err != nil {
		return "", fmt.Errorf("install agent: %w", err)
	}
	defer os.RemoveAll(tmp) // no-op after the rename
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("install agent: %w", err)
	}
	if err := os.Mkdir(filepath.Join(tmp, filepath.Dir(agentInBox)), 0o755); err != nil {
		return "", fmt.Errorf("install agent: %w", err)
	}
	if err := hostimage.CopyFile(src, filepath.Join(tmp, agentInBox), 0o755); err != nil {
		return "", fmt.Errorf("install agent: %w", err)
	}
	if err := os.Rename(tmp, layer); err != nil {
		return "", fmt.Errorf("install agent: %w", err)
	}
	return layer, nil
}

// removeUnusedAgentLayers removes the agent layers that are neither the
// current one nor a lower layer of a box that still exists (each box dir
// names its layer in agentLayerFile).
func (d *Driver) removeUnusedAgentLayers() {
	keep := map[string]bool{filepath.Base(d.agentLayer): true}
	boxes, _ := os.ReadDir(d.boxesDir)
	for _, b := range boxes {
		name, err := os.ReadFile(agentLayerFile(filepath.Join(d.boxesDir, b.Name())))
		if err != nil {
			// A box from before agent layers, or half made: it names no
			// layer. Keep them all rather than guess.
			return
		}
		keep[strings.TrimSpace(string(name))] = true
	}
	dir := filepath.Dir(d.agentLayer)
	layers, _ := os.ReadDir(dir)
	for _, l := range layers {
		if !keep[l.Name()] {
			if err := os.RemoveAll(filepath.Join(dir, l.Name())); err != nil {
				d.log.Warn("removing an unused agent layer", "layer", l.Name(), "err", err)
			}
		}
	}
}

func (d *Driver) Name() string { return "oci" }

func (d *Driver) Info(ctx context.Context) runtime.Info {
	return runtime.Info{
		Name:         "oci",
		Healthy:      d.healthy,
		Detail:       d.detail,
		Capabilities: d.caps,
		StoredIDs:    idmap.Canonical,
	}
}

var validCgroupParent = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9_.-]*$`)

func checkID(id string) error { return ocibox.CheckID(id) }

func (d *Driver) boxDir(id string) string { return filepath.Join(d.boxesDir, id) }

// Paths inside a box dir.
func sockPath(box string) string  { return filepath.Join(box, "agent.sock") }
func execSock(box string) string  { return filepath.Join(box, "exec.sock") }
func rwDir(box string) string     { return filepath.Join(box, "rw") }
func bundleDir(box string) string { return filepath.Join(box, "bundle") }
func rootfsDir(box string) string { return filepath.Join(box, "bundle", "rootfs") }
func pidFile(box string) string   { return filepath.Join(box, "init.pid") }
func agentLog(box string) string  { return filepath.Join(box, "agent.log") }

// agentLayerFile names the agent layer the box's overlay uses.
func agentLayerFile(box string) string { return filepath.Join(box, "agent-layer") }

func (d *Driver) Create(ctx context.Context, spec runtime.Spec) (h runtime.Handle, err error) {
	pt := phases.Start()
	if err := checkID(spec.ID); err != nil {
		return h, err
	}
	if err := spec.Validate(); err != nil {
		return h, err
	}
	netns := spec.Network.NetNSPath()
	lowers, hostImage, err := d.lowers(spec.Image)
	if err != nil {
		return h, err
	}
	var undo cleanup.Stack
	defer func() {
		if err != nil {
			if cerr := undo.Run(); cerr != nil {
				d.log.Warn("rolling back box", "id", spec.ID, "err", cerr)
			}
		}
	}()
	box, err := ocibox.MakeBoxDir(d.boxesDir, spec.ID, &undo, os.RemoveAll, sockPath(d.boxDir(spec.ID)))
	if err != nil {
		return h, err
	}
	if err := os.WriteFile(agentLayerFile(box), []byte(filepath.Base(d.agentLayer)+"\n"), 0o600); err != nil {
		return h, fmt.Errorf("record agent layer: %w", err)
	}
	ids, err := d.newBoxIDs(box, &undo)
	if err != nil {
		return h, err
	}
	defer ids.Close()
	pt.Mark("ids")

	// Writable layer: a tmpfs bounding its size, its dirs stored in the
	// canonical range like every tree, shown to the box (and to the
	// overlay, which works in them as box root) in its own.
	rw := rwDir(box)
	if _, _, err := ocibox.WritableLayer(rw, spec.Resources.DiskBytes, int(idmap.Canonical.Base), &undo); err != nil {
		return h, err
	}
	if err := ids.mapDir(rw, rwMapDir(box), false); err != nil {
		return h, fmt.Errorf("writable layer: %w", err)
	}
	pt.Mark("rw")
	if lowers, err = ids.lowers(lowers); err != nil {
		return h, err
	}
	pt.Mark("layers")
	rootfs := rootfsDir(box)
	if err := os.MkdirAll(rootfs, 0o711); err != nil {
		return h, fmt.Errorf("create rootfs dir: %w", err)
	}
	// As box root: host root has no id in the idmapped layers, so neither
	// the overlay's own work (copy-ups, whiteouts) nor prepareRootfs's
	// files could be made as host root. Layers named by fd: no host path
	// in the box's mountinfo. The agent layer (topmost) is not idmapped:
	// its files are host root's and show as nobody, as before.
	err = idmap.AsBox(ids.r, func() error {
		if err := overlay.Mount(rootfs, append(lowers, d.agentLayer),
			filepath.Join(rwMapDir(box), "upper"), filepath.Join(rwMapDir(box), "work"), "", 0); err != nil {
			return err
		}
		undo.Add(func() error { return hostmount.Unmount(rootfs) })
		return d.prepareRootfs(rootfs, spec, int(ids.r.Base))
	})
	if err != nil {
		return h, err
	}
	pt.Mark("overlay")
	mounts, err := ids.mounts(spec.Mounts)
	if err != nil {
		return h, err
	}
	fuseDev := ""
	if d.fuse {
		if fuseDev, err = makeFuseDevice(box, ids.r.Base); err != nil {
			return h, err
		}
		undo.Add(func() error { return hostmount.Unmount(fuseDevDir(box)) })
	}
	pt.Mark("mounts")
	sysfs := ""
	if netns != "" {
		sysfs = sysfsDir(box)
		if err := os.Mkdir(sysfs, 0o555); err != nil {
			return h, fmt.Errorf("create sysfs dir: %w", err)
		}
		if err := mountSysfsIn(netns, sysfs); err != nil {
			return h, err
		}
		undo.Add(func() error { return hostmount.Unmount(sysfs) })
		pt.Mark("sysfs")
	}

	hostname := spec.Hostname
	if hostname == "" {
		hostname = spec.ID
	}
	ociSpec := buildSpec(specParams{
		ID: spec.ID, CgroupParent: d.cg.parent, Hostname: hostname, Command: spec.Command, Env: spec.Env, Workdir: spec.Workdir,
		Resources: spec.Resources, HostImage: hostImage, AgentPath: filepath.Join(rootfs, agentInBox),
		NoFile: d.boxNoFile(spec.Resources.Pids), SwapLimit: d.swapLimit, NetNS: netns, SysfsSource: sysfs,
		Mounts: mounts, FuseDevice: fuseDev, AgentSeccomp: d.agentSeccomp, IDs: ids.r, UserNS: userNSFile(box),
		UserCgroups: len(d.cg.userCgroupControllers()),
	})
	cfg, err := json.Marshal(ociSpec)
	if err != nil {
		return h, fmt.Errorf("encode oci spec: %w", err)
	}
	if err := os.WriteFile(filepath.Join(bundleDir(box), "config.json"), cfg, 0o600); err != nil {
		return h, fmt.Errorf("write oci spec: %w", err)
	}

	pt.Mark("spec")
	data := boxData{Version: handleVersion, Runtime: d.rt.path, Dir: box, IDs: ids.r}
	// From here on the runtime may hold state, a cgroup and processes.
	undo.Add(func() error { return d.teardownProcesses(context.WithoutCancel(ctx), spec.ID, &data) })
	crashpoint.Hit("oci-create-rootfs")
	userCgroups, err := d.cg.makeUserCgroups(spec.ID, spec.Resources, d.swapLimit)
	if err != nil {
		return h, err
	}
	pt.Mark("cgroups")
	// The box starts at full weight (startboost.go) until its agent is ready.
	if err := d.boost.begin(); err != nil {
		return h, err
	}
	ready, err := d.start(ctx, spec.ID, box, netns, userCgroups, &data)
	if err != nil {
		d.endBoost()
		return h, err
	}
	crashpoint.Hit("oci-create-started")
	crashpoint.Pause(ctx, "oci-create-starting", spec.ID)
	if testHookStarted != nil {
		testHookStarted(spec.ID)
	}
	pt.Mark("runtime")
	err = agentconn.AwaitReady(ctx, ready, runtime.ProbeTimeout)
	ready.Close()
	d.endBoost()
	// crun's detached child, gone by now (it exits once the init runs),
	// and any an earlier create left.
	d.rt.reapOrphans()
	if err != nil {
		return h, fmt.Errorf("box %s: %w%s", spec.ID, err, logTail(agentLog(box)))
	}
	if err := d.cg.setBoxWeight(spec.ID, spec.Resources.CPUMillis); err != nil {
		return h, err
	}
	pt.Mark("agent")
	raw, _ := json.Marshal(data)
	undo.Release()
	d.log.Debug("box created", "id", spec.ID, "phases", pt)
	return runtime.Handle{ID: spec.ID, Driver: "oci", Data: raw}, nil
}

// lowers returns the image's lower dirs, lowest first.
func (d *Driver) lowers(img runtime.Image) (lowers []string, hostImage bool, err error) {
	return ocibox.Lowers(d.imagesDir, img, int(idmap.Canonical.Base))
}

// prepareRootfs writes per-box files into the writable layer: /etc/hostname,
// /etc/hosts, /etc/resolv.conf (when the network names DNS servers) and the working
// directory.
func (d *Driver) prepareRootfs(rootfs string, spec runtime.Spec, root int) error {
	files, err := ocibox.EtcFiles(spec)
	if err != nil {
		return err
	}
	if err := mkdirInRoot(rootfs, "/etc", root, root); err != nil {
		return err
	}
	for name, content := range files {
		err := writeFileInRoot(rootfs, name, []byte(content), root, root)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			// The image's /etc is a dangling symlink or not a dir: its problem.
			d.log.Debug("not writing into image /etc", "file", name, "err", err)
			continue
		}
		if err != nil {
			return err
		}
	}
	return mkdirInRoot(rootfs, spec.Workdir, root, root)
}

// start runs the box's runtime with the agent as init. The agent inherits
// the listening sockets the daemon made, for its API (fd 3) and for framed
// execs (fd 5), so a Dial never races its start, and the write end of a pipe
// (fd 4) on which it says it serves; start returns the read end. The files
// in extra (the user cgroups' tasks files) follow as fds 6 and up; start
// closes the daemon's copies.
//
// A network namespace to join (netns) is joined by the runtime's own
// process, not through config.json: the runtime joins the box's user
// namespace first, after which it has no privilege over a namespace host
// root owns; config.json then names no network namespace and the box stays
// in the runtime's.
func (d *Driver) start(ctx context.Context, id, box, netns string, extra []*os.File, data *boxData) (ready *os.File, err error) {
	af, err := runtime.NewAgentFiles(sockPath(box), execSock(box))
	if err != nil {
		for _, f := range extra {
			f.Close()
		}
		return nil, err
	}
	af.Extra = append(af.Extra, extra...)
	// After the runtime has run, only the agent holds the write end.
	defer af.CloseExtra()
	defer func() {
		if err != nil {
			af.Ready.Close()
		}
	}()
	logf, err := os.OpenFile(agentLog(box), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create agent log: %w", err)
	}
	defer logf.Close()

	// --no-new-keyring: a session keyring per box would be charged to the
	// box's host uid and cap the host at kernel.keys.maxkeys (200) boxes per
	// uid; boxes cannot use keyrings anyway (keyctl, add_key and request_key
	// are refused by the seccomp profile).
	cmd := d.rt.command(ctx, "run", "--detach", "--no-new-keyring", "--preserve-fds", strconv.Itoa(len(af.Extra)),
		"--pid-file", pidFile(box), "--bundle", bundleDir(box), id)
	cmd.ExtraFiles = af.Extra
	cmd.Stdout, cmd.Stderr = logf, logf // inherited by the agent too: its log
	if d.rt.hide != "" {
		// crun does not see the cgroup2 hierarchy (crunHideUnified): the
		// runtime starts in the box's cgroup there, so the box and its
		// cgroup namespace are in their own in every hierarchy.
		cg, err := d.cg.unifiedBoxCgroup(id)
		if err != nil {
			return nil, err
		}
		defer cg.Close()
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
		// A cut-off create kills every crun process, its detached child
		// too, and what it started, before the rollback.
		cmd.Cancel = func() error { return d.cg.killUnifiedBoxCgroup(id) }
	}
	if err := runCmd(cmd, netns, d.rt.hide); err != nil {
		return nil, fmt.Errorf("%s run: %w%s", d.rt.name, err, logTail(agentLog(box)))
	}
	if err := d.cg.narrowDevices(id); err != nil {
		return nil, fmt.Errorf("%s run: %w", d.rt.name, err)
	}
	b, err := os.ReadFile(pidFile(box))
	if err != nil {
		return nil, fmt.Errorf("read init pid: %w", err)
	}
	if _, err := fmt.Sscan(string(b), &data.Pid); err != nil {
		return nil, fmt.Errorf("parse init pid %q: %w", b, err)
	}
	data.StartTime = procStartTime(data.Pid)
	return af.Ready, nil
}

// logTail returns the end of the agent log for error messages.
func logTail(path string) string { return ocibox.LogTail(path) }

// parseData reads a handle's data of any version this driver wrote
// (version 0 has today's fields); a newer version is an error wrapping
// runtime.ErrHandleVersion, and undecodable data gives zero data with the
// error (Destroy goes on by the box id alone either way).
func parseData(h runtime.Handle) (boxData, error) {
	data, v, err := runtime.DecodeHandle[boxData](h, handleVersion)
	if err != nil {
		return boxData{}, err
	}
	if v == 0 {
		data.Version = handleVersion // same fields
	}
	return data, nil
}

func (d *Driver) Pause(ctx context.Context, h runtime.Handle) error {
	return d.setPaused(ctx, h, true)
}

func (d *Driver) Resume(ctx context.Context, h runtime.Handle) error {
	return d.setPaused(ctx, h, false)
}

func (d *Driver) setPaused(ctx context.Context, h runtime.Handle, pause bool) error {
	if err := checkID(h.ID); err != nil {
		return err
	}
	verb, want := "resume", "running"
	if pause {
		verb, want = "pause", "paused"
	}
	err := d.rt.run(ctx, verb, h.ID)
	if err == nil {
		return nil
	}
	st, serr := d.rt.state(ctx, h.ID)
	if serr != nil {
		return fmt.Errorf("%s box %s: %w", verb, h.ID, serr)
	}
	if st.Status == want {
		return nil // already there
	}
	return fmt.Errorf("%s box %s: %w", verb, h.ID, err)
}

func (d *Driver) Stats(ctx context.Context, h runtime.Handle) (runtime.Stats, error) {
	if err := checkID(h.ID); err != nil {
		return runtime.Stats{}, err
	}
	st, err := d.cg.stats(h.ID)
	if err != nil {
		return st, fmt.Errorf("stats of box %s: %w", h.ID, errors.Join(err, errdefs.ErrNotFound))
	}
	st.DiskUsedBytes, _ = diskUsed(rwDir(d.boxDir(h.ID)))
	return st, nil
}

// LimitEvents reads the box's counts of OOM kills and refused forks
// (runtime.LimitEventer).
func (d *Driver) LimitEvents(_ context.Context, h runtime.Handle) (runtime.LimitEvents, error) {
	if err := checkID(h.ID); err != nil {
		return runtime.LimitEvents{}, err
	}
	ev, err := d.cg.limitEvents(h.ID)
	if err != nil {
		return ev, fmt.Errorf("limit events of box %s: %w", h.ID, errors.Join(err, errdefs.ErrNotFound))
	}
	return ev, nil
}

// DialExec connects to the agent's framed exec socket (runtime.ExecDialer).
func (d *Driver) DialExec(ctx context.Context, h runtime.Handle) (net.Conn, error) {
	if err := checkID(h.ID); err != nil {
		return nil, err
	}
	path := execSock(d.boxDir(h.ID))
	var dl net.Dialer
	c, err := dl.DialContext(ctx, "unix", path)
	if err != nil {
		if _, serr := os.Lstat(path); errors.Is(serr, os.ErrNotExist) {
			return nil, fmt.Errorf("box %s has no exec socket: %w", h.ID, errors.ErrUnsupported)
		}
		return nil, fmt.Errorf("dial agent exec socket of box %s: %w", h.ID, err)
	}
	return c, nil
}

func (d *Driver) Dial(ctx context.Context, h runtime.Handle) (net.Conn, error) {
	if err := checkID(h.ID); err != nil {
		return nil, err
	}
	var dl net.Dialer
	c, err := dl.DialContext(ctx, "unix", sockPath(d.boxDir(h.ID)))
	if err != nil {
		return nil, fmt.Errorf("dial agent of box %s: %w", h.ID, err)
	}
	return c, nil
}
