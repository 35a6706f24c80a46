package integration

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sbxdaemon "github.com/sbxdev/sbx/internal/daemon"
	"github.com/sbxdev/sbx/internal/testutil"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

var build struct {
	sync.Once
	dir string
	err error
}

// TestMain removes the binaries built for the run (50 MB a run otherwise
// left in the temp dir).
func TestMain(m *testing.M) {
	code := m.Run()
	if build.dir != "" {
		_ = os.RemoveAll(build.dir)
	}
	os.Exit(code)
}

// binaries builds bin/sbx and bin/sbx-agent side by side once per test run.
func binaries(t *testing.T) string {
	t.Helper()
	build.Do(func() {
		dir, err := os.MkdirTemp("", "sbx-e2e-bin-")
		if err != nil {
			build.err = err
			return
		}
		_ = os.Chmod(dir, 0o755)
		for _, pkg := range []string{"sbx", "sbx-agent", "sbx-userns-helper"} {
			// With crash points compiled in (inert unless a test arms them
			// through the daemon's environment; see internal/crashpoint).
			cmd := exec.Command("go", "build", "-tags", "sbxcrashpoints", "-o", filepath.Join(dir, pkg), "../cmd/"+pkg)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				build.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
				return
			}
		}
		build.dir = dir
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.dir
}

// daemon is one running `sbx serve`.
type daemon struct {
	t       *testing.T
	bin     string
	addr    string
	dataDir string
	cmd     *exec.Cmd
	log     *os.File
	exited  chan struct{}
	args    []string
	// env is added to the daemon's environment at each start.
	env []string
	// token is the daemon's API token ("" = none).
	token string
	// tls, when set, is the clients' TLS configuration (the daemon serves HTTPS).
	tls *tls.Config
}

// url is the daemon's address as its clients use it.
func (d *daemon) url() string {
	if d.tls != nil {
		return "https://" + d.addr
	}
	return d.addr
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startDaemon starts a daemon over a fresh data dir (with no warm pool, so
// every box on the host belongs to a sandbox); the test's cleanup destroys
// whatever sandboxes remain and stops it.
func startDaemon(t *testing.T, extraArgs ...string) *daemon {
	t.Helper()
	return startDaemonToken(t, "", extraArgs...)
}

// startDaemonToken is startDaemon with an API token (given to the daemon in
// a file; "" = none) that the harness's clients send.
func startDaemonToken(t *testing.T, token string, extraArgs ...string) *daemon {
	t.Helper()
	return startDaemonOpts(t, daemonOpts{token: token, tokenFile: token != ""}, extraArgs...)
}

// daemonOpts are how the harness talks to a daemon.
type daemonOpts struct {
	// token is what the harness's clients send; tokenFile also gives it to
	// the daemon (--auth-token-file).
	token     string
	tokenFile bool
	// tls, when set, makes the clients speak HTTPS with it.
	tls *tls.Config
	// env is added to the daemon's environment (daemon.env).
	env []string
}

func startDaemonOpts(t *testing.T, o daemonOpts, extraArgs ...string) *daemon {
	t.Helper()
	token := o.token
	testutil.RequiresRoot(t)
	dir := binaries(t)
	// Sandboxes' user namespaces must traverse to their bundles: no 0700 parents.
	data, err := os.MkdirTemp("", "sbx-e2e-data-")
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(data, 0o711)
	d := &daemon{t: t, bin: filepath.Join(dir, "sbx"), addr: freeAddr(t), dataDir: data, args: extraArgs, token: token, tls: o.tls, env: o.env}
	if o.tokenFile {
		tf := filepath.Join(data, "token")
		if err := os.WriteFile(tf, []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		d.args = append([]string{"--auth-token-file", tf}, d.args...)
	}
	// Registered before the start, so that a daemon failing at start leaves
	// no data dir behind either.
	t.Cleanup(func() {
		if d.cmd != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c := d.client()
			if list, err := c.List(ctx); err == nil {
				for _, sb := range list {
					_ = sb.Destroy(ctx)
				}
			}
			d.stop()
		}
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(d.dataDir, "daemon.log")); err == nil {
				t.Logf("daemon log:\n%s", tail(string(b), 60))
			}
		}
		os.RemoveAll(d.dataDir)
	})
	d.start()
	return d
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (d *daemon) start() {
	t := d.t
	t.Helper()
	logf, err := os.OpenFile(filepath.Join(d.dataDir, "daemon.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	d.log = logf
	args := []string{"serve", "--listen", d.addr, "--data-dir", d.dataDir, "--default-timeout", "10m", "--log-level", "debug", "--warm-pool", "0",
		"--network=false"} // network tests turn it on with a bridge of their own
	d.cmd = exec.Command(d.bin, append(args, d.args...)...)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	if len(d.env) > 0 {
		d.cmd.Env = append(os.Environ(), d.env...)
	}
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.exited = make(chan struct{})
	go func(cmd *exec.Cmd, ch chan struct{}) { _ = cmd.Wait(); close(ch) }(d.cmd, d.exited)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := d.client().Version(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-d.exited:
			b, _ := os.ReadFile(filepath.Join(d.dataDir, "daemon.log"))
			t.Fatalf("daemon exited at start:\n%s", b)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatal("daemon did not answer within 30s")
}

// kill9 kills the daemon the hard way.
func (d *daemon) kill9() {
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
	d.log.Close()
	d.cmd = nil
}

func (d *daemon) stop() {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(15 * time.Second):
		_ = d.cmd.Process.Signal(syscall.SIGKILL)
		<-d.exited
	}
	d.log.Close()
	d.cmd = nil
}

func (d *daemon) client() *sbx.Client {
	if d.tls != nil {
		return sbx.NewClient(d.url(), sbx.WithToken(d.token), sbx.WithTLS(d.tls))
	}
	return sbx.NewClient(d.addr, sbx.WithToken(d.token))
}

// cli runs the sbx CLI against this daemon and returns stdout, stderr and the exit code.
func (d *daemon) cli(stdin string, args ...string) (string, string, int) {
	d.t.Helper()
	cmd := exec.Command(d.bin, append([]string{"--addr", d.url()}, args...)...)
	cmd.Env = append(os.Environ(), "SBX_TOKEN="+d.token)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.Stdin = strings.NewReader(stdin)
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		d.t.Fatalf("sbx %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// leaks lists host resources under the data dir or named after sandboxes
// that should not exist when only the sandboxes in live remain.
func (d *daemon) leaks(live ...string) []string {
	keep := map[string]bool{}
	for _, id := range live {
		keep[id] = true
	}
	var out []string
	f, err := os.Open("/proc/self/mountinfo")
	if err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			// Network namespaces have checks of their own (network_test.go).
			// runsc's empty network namespace for gvisor boxes is the
			// daemon's, unmounted when it stops (gvisor's Driver.Close).
			if len(fields) > 4 && strings.HasPrefix(fields[4], d.dataDir) && !mentionsAny(fields[4], keep) &&
				!strings.HasPrefix(fields[4], filepath.Join(d.dataDir, "network")+"/") &&
				fields[4] != filepath.Join(d.dataDir, "gvisor", "runsc", "null-netns") {
				out = append(out, "mount "+fields[4])
			}
		}
		f.Close()
	}
	// Each driver says what is left of its boxes (runtime.Prober, through
	// the daemon, which knows where the drivers keep them).
	left, err := sbxdaemon.Leftovers(d.dataDir, keep)
	if err != nil {
		out = append(out, "probing drivers: "+err.Error())
	}
	for _, l := range left {
		out = append(out, l.String())
	}
	out = append(out, d.zombies()...)
	procs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, kv := range strings.Split(string(b), "\x00") {
			if id, ok := strings.CutPrefix(kv, "SBX_SANDBOX_ID="); ok && d.owns(id) && !keep[id] {
				out = append(out, "process "+filepath.Dir(p)+" of "+id)
			}
		}
	}
	return out
}

// zombies lists the running daemon's children that exited and were never
// reaped: box processes it adopted as a subreaper (runc's init, runsc's
// sandbox and gofer) must be reaped when their box goes.
func (d *daemon) zombies() []string {
	if d.cmd == nil || d.cmd.Process == nil {
		return nil
	}
	var out []string
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", d.cmd.Process.Pid))
	for _, t := range tasks {
		b, _ := os.ReadFile(t)
		for _, pid := range strings.Fields(string(b)) {
			st, err := os.ReadFile("/proc/" + pid + "/stat")
			if i := strings.LastIndexByte(string(st), ')'); err == nil && i > 0 && i+2 < len(st) && st[i+2] == 'Z' {
				out = append(out, "zombie "+pid+" of the daemon: "+string(st[:i+1]))
			}
		}
	}
	return out
}

// created remembers sandbox ids this daemon made, so leak checks ignore
// other tests' sandboxes running at the same time.
var created sync.Map

func (d *daemon) owns(id string) bool {
	v, ok := created.Load(id)
	return ok && v.(string) == d.dataDir
}

func (d *daemon) remember(id string) { created.Store(id, d.dataDir) }

func mentionsAny(s string, ids map[string]bool) bool {
	for id := range ids {
		if strings.Contains(s, id) {
			return true
		}
	}
	return false
}

func (d *daemon) assertNoLeaks(live ...string) {
	d.t.Helper()
	// Destroy answers before its box is torn down (in the background):
	// wait for the teardown, and for reaped processes to vanish from /proc.
	var l []string
	for range 50 {
		if l = d.leaks(live...); len(l) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	d.t.Errorf("leaked host resources:\n  %s", strings.Join(l, "\n  "))
}
