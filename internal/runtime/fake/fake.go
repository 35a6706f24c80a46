// Package fake is a runtime.Driver for tests that need real agents but no
// root: each "box" is the sbx-agent binary started as a plain child process
// of the caller, serving on a Unix socket the driver made (passed as fd 3,
// exactly as real drivers do). There is NO isolation at all — no namespaces,
// no cgroups, no filesystem of its own; commands run on the host as the
// caller. Use it only to unit-test code above the Driver contract
// (internal/sandbox). Pause and Resume stop and continue the agent's process
// group with SIGSTOP/SIGCONT.
package fake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sbxdev/sbx/internal/agentconn"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
)

// Config configures a fake Driver.
type Config struct {
	// StateDir holds one directory per box (its socket, pid file and log).
	StateDir string
	// AgentPath is the sbx-agent binary to start.
	AgentPath string
}

// Driver is the fake driver. It keeps no state in memory.
type Driver struct {
	cfg Config
}

var _ runtime.Driver = (*Driver)(nil)

// New returns a fake driver.
func New(cfg Config) (*Driver, error) {
	if cfg.StateDir == "" || cfg.AgentPath == "" {
		return nil, fmt.Errorf("fake: state dir and agent path are required: %w", errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("fake: %w", err)
	}
	return &Driver{cfg: cfg}, nil
}

// handleVersion is the version of boxData Create writes (runtime.DecodeHandle):
// 0 had no "v", 1 the same fields with it.
const handleVersion = 1

type boxData struct {
	Version   int    `json:"v"`
	Pid       int    `json:"pid"`
	StartTime string `json:"start_time"` // /proc/pid/stat field 22 ("" off Linux)
}

func (d *Driver) Name() string { return "fake" }

// Capabilities are what the fake declares. Its boxes are host processes: it
// "has" the host image and the host's network, and accepts mounts and path
// policies it does not realise, so tests of the layers above can use them.
var Capabilities = []runtime.Capability{runtime.CapPause, runtime.CapRecover, runtime.CapHostImage,
	runtime.CapVolumes, runtime.CapCodebases, runtime.CapPathPolicies, runtime.CapNetwork,
	runtime.CapNetworkReplug}

func (d *Driver) Info(context.Context) runtime.Info {
	return runtime.Info{Name: "fake", Healthy: true, Detail: "no isolation: agents run as host processes",
		Capabilities: Capabilities}
}

var validID = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

func (d *Driver) dir(id string) (string, error) {
	if !validID.MatchString(id) {
		return "", fmt.Errorf("box id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	return filepath.Join(d.cfg.StateDir, id), nil
}

func (d *Driver) Create(ctx context.Context, spec runtime.Spec) (h runtime.Handle, err error) {
	dir, err := d.dir(spec.ID)
	if err != nil {
		return h, err
	}
	if err := spec.Validate(); err != nil {
		return h, err
	}
	for _, l := range spec.Image.Layers {
		if _, err := os.Stat(l.Dir); err != nil {
			return h, fmt.Errorf("image layer %q: %w", l.Dir, errdefs.ErrInvalidArgument)
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return h, fmt.Errorf("box %s: %w", spec.ID, errdefs.ErrAlreadyExists)
		}
		return h, err
	}
	var data boxData
	defer func() {
		if err != nil {
			_ = d.destroy(dir, data)
		}
	}()
	af, err := runtime.NewAgentFiles(filepath.Join(dir, "agent.sock"), filepath.Join(dir, "exec.sock"))
	if err != nil {
		return h, err
	}
	defer af.Ready.Close()
	defer af.CloseExtra() // on an early return; right after Start otherwise
	logf, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		return h, err
	}
	defer logf.Close()
	args := slices.Clone(runtime.AgentFDArgs)
	if len(spec.Command) > 0 {
		args = append(append(args, "--"), spec.Command...)
	}
	cmd := exec.Command(d.cfg.AgentPath, args...)
	cmd.Env = append(os.Environ(), spec.Env...)
	cmd.ExtraFiles = af.Extra
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	af.CloseExtra()
	if err != nil {
		return h, fmt.Errorf("start agent: %w", err)
	}
	data = boxData{Version: handleVersion, Pid: cmd.Process.Pid, StartTime: startTime(cmd.Process.Pid)}
	_ = cmd.Process.Release() // reaped by pid in Destroy, also from a new Driver
	raw, _ := json.Marshal(data)
	if err := os.WriteFile(filepath.Join(dir, "handle.json"), raw, 0o600); err != nil {
		return h, err
	}
	h = runtime.Handle{ID: spec.ID, Driver: "fake", Data: raw}
	if err := agentconn.AwaitReady(ctx, af.Ready, runtime.ProbeTimeout); err != nil {
		return h, fmt.Errorf("box %s: %w", spec.ID, err)
	}
	return h, nil
}

func (d *Driver) load(h runtime.Handle) (string, boxData, error) {
	dir, err := d.dir(h.ID)
	if err != nil {
		return "", boxData{}, err
	}
	if len(h.Data) == 0 {
		h.Data, _ = os.ReadFile(filepath.Join(dir, "handle.json"))
	}
	data, _, err := runtime.DecodeHandle[boxData](h, handleVersion)
	if errors.Is(err, runtime.ErrHandleVersion) {
		return "", boxData{}, err
	}
	return dir, data, nil // undecodable: nothing known but the dir
}

// alive reports whether data still names our agent (not a reused pid).
func alive(data boxData) bool {
	return data.Pid > 0 && syscall.Kill(data.Pid, 0) == nil && startTime(data.Pid) == data.StartTime
}

func (d *Driver) Recover(ctx context.Context, h runtime.Handle) (runtime.Handle, error) {
	dir, data, err := d.load(h)
	if err != nil {
		return h, err
	}
	if alive(data) && procState(data.Pid) == "T" {
		return h, nil // stopped: a frozen agent cannot answer; Resume will tell
	}
	if alive(data) {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		conn := agentconn.New(func(ctx context.Context) (net.Conn, error) { return d.Dial(ctx, h) })
		defer conn.Close()
		if _, err = conn.Hello(ctx); err == nil {
			return h, nil
		}
	}
	_ = d.destroy(dir, data)
	return h, fmt.Errorf("recover box %s: %w", h.ID, errdefs.ErrNotFound)
}

func (d *Driver) signal(h runtime.Handle, sig syscall.Signal) error {
	_, data, err := d.load(h)
	if err != nil {
		return err
	}
	if !alive(data) {
		return fmt.Errorf("box %s: %w", h.ID, errdefs.ErrNotFound)
	}
	return syscall.Kill(-data.Pid, sig)
}

func (d *Driver) Pause(_ context.Context, h runtime.Handle) error {
	if err := d.signal(h, syscall.SIGSTOP); err != nil {
		return err
	}
	// Signals are delivered asynchronously: return once the agent is stopped.
	_, data, err := d.load(h)
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(5 * time.Second); procState(data.Pid) != "T"; {
		if time.Now().After(deadline) {
			return fmt.Errorf("box %s did not stop", h.ID)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

func (d *Driver) Resume(_ context.Context, h runtime.Handle) error {
	return d.signal(h, syscall.SIGCONT)
}

func (d *Driver) Destroy(_ context.Context, h runtime.Handle) error {
	dir, data, err := d.load(h)
	if errors.Is(err, runtime.ErrHandleVersion) {
		// A newer daemon's box: still destroyed, by the fields this
		// version knows (the contract: Destroy works from the id alone).
		if dir, err = d.dir(h.ID); err == nil {
			_ = json.Unmarshal(h.Data, &data)
		}
	}
	if err != nil {
		return err
	}
	return d.destroy(dir, data)
}

func (d *Driver) destroy(dir string, data boxData) error {
	if alive(data) {
		_ = syscall.Kill(-data.Pid, syscall.SIGKILL)
		_ = syscall.Kill(-data.Pid, syscall.SIGCONT)
		reap(data.Pid)
	}
	return os.RemoveAll(dir)
}

// reap waits (bounded) for pid, our child unless we restarted.
func reap(pid int) {
	for i := 0; i < 1000; i++ {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		if got == pid || (err != nil && !errors.Is(err, syscall.EINTR)) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func (d *Driver) Stats(context.Context, runtime.Handle) (runtime.Stats, error) {
	return runtime.Stats{}, fmt.Errorf("fake driver has no stats: %w", errdefs.ErrFailedPrecondition)
}

// DialExec connects to the agent's framed exec socket (runtime.ExecDialer).
// A box without one (an agent older than the socket) is
// errors.ErrUnsupported, as for the oci driver: the daemon then falls back
// to the Exec RPC.
func (d *Driver) DialExec(ctx context.Context, h runtime.Handle) (net.Conn, error) {
	c, err := d.dialSocket(ctx, h, "exec.sock")
	if err != nil {
		if dir, derr := d.dir(h.ID); derr == nil {
			if _, serr := os.Lstat(filepath.Join(dir, "exec.sock")); errors.Is(serr, os.ErrNotExist) {
				return nil, fmt.Errorf("box %s has no exec socket: %w", h.ID, errors.ErrUnsupported)
			}
		}
		return nil, err
	}
	return c, nil
}

func (d *Driver) Dial(ctx context.Context, h runtime.Handle) (net.Conn, error) {
	return d.dialSocket(ctx, h, "agent.sock")
}

// dialSocket connects to the socket name in box h's dir.
func (d *Driver) dialSocket(ctx context.Context, h runtime.Handle, name string) (net.Conn, error) {
	dir, err := d.dir(h.ID)
	if err != nil {
		return nil, err
	}
	var dl net.Dialer
	return dl.DialContext(ctx, "unix", filepath.Join(dir, name))
}

func (d *Driver) Cleanup(ctx context.Context, keep map[string]bool) error {
	ents, err := os.ReadDir(d.cfg.StateDir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if keep[e.Name()] || !validID.MatchString(e.Name()) {
			continue
		}
		dir, data, _ := d.load(runtime.Handle{ID: e.Name()})
		errs = append(errs, d.destroy(dir, data))
	}
	return errors.Join(errs...)
}

// startTime is field 22 of /proc/pid/stat, or "" where there is no /proc.
// procState is the one-letter state of a process ("R", "S", "T", ...).
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		if f := strings.Fields(s[i+1:]); len(f) >= 1 {
			return f[0]
		}
	}
	return ""
}

func startTime(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		if f := strings.Fields(s[i+1:]); len(f) >= 20 {
			return f[19]
		}
	}
	return ""
}

var _ runtime.Prober = (*Driver)(nil)

// HostPids is the agent's pid (runtime.Prober).
func (d *Driver) HostPids(_ context.Context, h runtime.Handle) ([]int, error) {
	_, data, err := d.load(h)
	if err != nil {
		return nil, err
	}
	if !alive(data) {
		return nil, nil
	}
	return []int{data.Pid}, nil
}

// Leftovers lists box dirs not in keep and their agents still alive
// (runtime.Prober).
func (d *Driver) Leftovers(_ context.Context, keep map[string]bool) ([]runtime.Leftover, error) {
	ents, err := os.ReadDir(d.cfg.StateDir)
	if err != nil {
		return nil, err
	}
	var out []runtime.Leftover
	for _, e := range ents {
		if keep[e.Name()] || !validID.MatchString(e.Name()) {
			continue
		}
		dir, data, _ := d.load(runtime.Handle{ID: e.Name()})
		out = append(out, runtime.Leftover{ID: e.Name(), What: "dir " + dir})
		if alive(data) {
			out = append(out, runtime.Leftover{ID: e.Name(), What: fmt.Sprintf("agent process %d", data.Pid)})
		}
	}
	return out, nil
}
