package agent

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sbxdev/sbx/api/gen/agent/v1"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/testutil"
	"golang.org/x/sys/unix"
)

// The users of the exec-as-user tests (their ids need not exist on the host).
const (
	execTestPasswd = `root:x:0:0:root:/root:/bin/sh
sbxtest:x:4242:4243:Test:/home/sbxtest:/bin/sh
nohome:x:4300:4300
`
	execTestGroup = `root:x:0:
sbxtest:x:4243:
g1:x:4201:sbxtest
g2:x:4202:other,sbxtest
g3:x:4203:other
`
)

// newUserTestAgent is a test agent resolving users with execTestPasswd and
// execTestGroup.
func newUserTestAgent(t *testing.T) *testAgent {
	t.Helper()
	passwd, group := userFiles(t, execTestPasswd, execTestGroup)
	return newTestAgent(t, func(c *Config) { c.passwdFile, c.groupFile = passwd, group })
}

// requiresUserSwitch skips the test unless the agent can run commands as the
// test users: it must be root, in a user namespace (if any) that maps them.
func requiresUserSwitch(t *testing.T) {
	t.Helper()
	testutil.RequiresRoot(t)
	for _, f := range []string{"/proc/self/uid_map", "/proc/self/gid_map"} {
		if !idsMapped(t, f, 4201, 4203, 4242, 4243, 4300, 12345) {
			t.Skipf("the test ids are not all mapped in %s (not root of the initial user namespace?)", f)
		}
	}
}

func idsMapped(t *testing.T, mapFile string, ids ...uint64) bool {
	f, err := os.Open(mapFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type rng struct{ lo, n uint64 }
	var ranges []rng
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 3 {
			continue
		}
		lo, err1 := strconv.ParseUint(fs[0], 10, 64)
		n, err2 := strconv.ParseUint(fs[2], 10, 64)
		if err1 == nil && err2 == nil {
			ranges = append(ranges, rng{lo, n})
		}
	}
	for _, id := range ids {
		if !slices.ContainsFunc(ranges, func(r rng) bool { return id >= r.lo && id-r.lo < r.n }) {
			return false
		}
	}
	return true
}

// openDir returns a new temp dir that every user may enter (t.TempDir and
// its parent are 0700).
func openDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	for _, p := range []string{d, filepath.Dir(d)} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// mustRun runs req and fails the test unless it exits 0.
func (a *testAgent) mustRun(t *testing.T, req *sbxv1.ExecRequest) string {
	t.Helper()
	res := a.run(t, req)
	if res.exited.GetExitCode() != 0 {
		t.Fatalf("%v: exit %d, error %q, stderr %q", req, res.exited.GetExitCode(), res.exited.GetError(), res.stderr)
	}
	return res.stdout
}

func TestExecAsUser(t *testing.T) {
	requiresUserSwitch(t)
	a := newUserTestAgent(t)
	tests := []struct {
		name string
		req  *sbxv1.ExecRequest
		want string
	}{
		{name: "uid", req: &sbxv1.ExecRequest{Argv: []string{"id", "-u"}, User: "sbxtest"}, want: "4242\n"},
		{name: "gid", req: &sbxv1.ExecRequest{Argv: []string{"id", "-g"}, User: "sbxtest"}, want: "4243\n"},
		{name: "env", req: &sbxv1.ExecRequest{Shell: `echo "$HOME $USER $LOGNAME $SBX_TEST"`, User: "sbxtest"}, want: "/home/sbxtest sbxtest sbxtest base\n"},
		{name: "env set wins", req: &sbxv1.ExecRequest{Shell: `echo "$HOME $USER"`, User: "sbxtest", Env: map[string]string{"HOME": "/h", "USER": "u"}}, want: "/h u\n"},
		{name: "by uid", req: &sbxv1.ExecRequest{Shell: `id -u; id -g; echo "$HOME $USER"`, User: "4242"}, want: "4242\n4243\n/home/sbxtest sbxtest\n"},
		{name: "with group", req: &sbxv1.ExecRequest{Shell: `id -u; id -g`, User: "sbxtest:g3"}, want: "4242\n4203\n"},
		{name: "no home", req: &sbxv1.ExecRequest{Shell: `id -u; echo "$HOME"`, User: "nohome"}, want: "4300\n/\n"},
		// docker's rule: a uid without a passwd entry gets gid 0.
		{name: "unknown uid", req: &sbxv1.ExecRequest{Shell: `id -u; id -g; id -G; echo "$HOME [$USER]"`, User: "12345"}, want: "12345\n0\n0\n/ []\n"},
		{name: "unknown uid:gid", req: &sbxv1.ExecRequest{Shell: `id -u; id -g; id -G`, User: "12345:4201"}, want: "12345\n4201\n4201\n"},
		{name: "root", req: &sbxv1.ExecRequest{Shell: `id -u; id -g; echo "$HOME $USER"`, User: "root"}, want: "0\n0\n/root root\n"},
		{name: "default is root", req: &sbxv1.ExecRequest{Shell: `id -u; echo "$HOME [$USER]"`}, want: "0\n/root []\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.Workdir = "/"
			if got := a.mustRun(t, tt.req); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}

	t.Run("supplementary groups", func(t *testing.T) {
		got := strings.Fields(a.mustRun(t, &sbxv1.ExecRequest{Argv: []string{"id", "-G"}, User: "sbxtest", Workdir: "/"}))
		slices.Sort(got)
		if want := []string{"4201", "4202", "4243"}; !slices.Equal(got, want) {
			t.Errorf("id -G: got %q, want %q", got, want)
		}
	})

	t.Run("no capabilities", func(t *testing.T) {
		caps := func(user string) map[string]string {
			out := a.mustRun(t, &sbxv1.ExecRequest{Argv: []string{"cat", "/proc/self/status"}, User: user, Workdir: "/"})
			m := map[string]string{}
			for line := range strings.SplitSeq(out, "\n") {
				if k, v, ok := strings.Cut(line, ":"); ok && strings.HasPrefix(k, "Cap") {
					m[k] = strings.TrimSpace(v)
				}
			}
			return m
		}
		const none = "0000000000000000"
		for _, user := range []string{"sbxtest", "12345"} {
			c := caps(user)
			for _, k := range []string{"CapEff", "CapPrm", "CapInh", "CapAmb"} {
				if c[k] != none {
					t.Errorf("user %s: %s = %q, want %s", user, k, c[k], none)
				}
			}
		}
		if c := caps(""); c["CapEff"] == none || c["CapEff"] == "" {
			t.Errorf("root: CapEff = %q, want capabilities (is the test root?)", c["CapEff"])
		}
	})

	t.Run("permission denied", func(t *testing.T) {
		dir := openDir(t)
		script := filepath.Join(dir, "root-only.sh")
		if err := os.WriteFile(script, []byte("#!/bin/sh\necho ran\n"), 0o700); err != nil {
			t.Fatal(err)
		}
		secret := filepath.Join(dir, "secret")
		if err := os.WriteFile(secret, []byte("s3cret\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		// Root may do both.
		if got := a.mustRun(t, &sbxv1.ExecRequest{Shell: script + "; cat " + secret, Workdir: "/"}); got != "ran\ns3cret\n" {
			t.Errorf("as root: got %q", got)
		}
		res := a.run(t, &sbxv1.ExecRequest{Argv: []string{script}, User: "sbxtest", Workdir: "/"})
		if res.exited.GetExitCode() != 126 || !strings.Contains(res.exited.GetError(), "permission denied") || res.stdout != "" {
			t.Errorf("running a root-only script as a user: got exit %d, error %q, stdout %q; want 126, permission denied",
				res.exited.GetExitCode(), res.exited.GetError(), res.stdout)
		}
		res = a.run(t, &sbxv1.ExecRequest{Argv: []string{"cat", secret}, User: "sbxtest", Workdir: "/"})
		if res.exited.GetExitCode() == 0 || !strings.Contains(res.stderr, "Permission denied") || res.stdout != "" {
			t.Errorf("reading a root-only file as a user: got exit %d, stdout %q, stderr %q", res.exited.GetExitCode(), res.stdout, res.stderr)
		}
		// A user's file is the user's.
		own := filepath.Join(dir, "own")
		if err := os.Mkdir(own, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(own, 0o777); err != nil { // past the umask
			t.Fatal(err)
		}
		out := a.mustRun(t, &sbxv1.ExecRequest{Shell: "touch f && stat -c '%u:%g' f", User: "sbxtest", Workdir: own})
		if out != "4242:4243\n" {
			t.Errorf("file created by the user: owner %q, want 4242:4243", out)
		}
	})

	t.Run("workdir not accessible", func(t *testing.T) {
		// The default workdir is in a 0700 temp dir of root's.
		res := a.run(t, &sbxv1.ExecRequest{Argv: []string{"true"}, User: "sbxtest"})
		if res.exited.GetExitCode() != 126 || !strings.Contains(res.exited.GetError(), "workdir") || !strings.Contains(res.exited.GetError(), "permission denied") {
			t.Errorf("got exit %d, error %q; want 126 naming the workdir", res.exited.GetExitCode(), res.exited.GetError())
		}
		if res.pid != 0 {
			t.Errorf("started pid %d, want no started event", res.pid)
		}
	})

	t.Run("pty", func(t *testing.T) {
		res := a.run(t, &sbxv1.ExecRequest{Shell: `id -u; id -G; stat -c '%u' "$(tty)"`, Tty: true, User: "sbxtest", Workdir: "/"})
		if res.exited.GetExitCode() != 0 {
			t.Fatalf("exit %d, error %q, output %q", res.exited.GetExitCode(), res.exited.GetError(), res.stdout)
		}
		lines := strings.Split(strings.TrimSpace(strings.ReplaceAll(res.stdout, "\r", "")), "\n")
		if len(lines) != 3 || lines[0] != "4242" || lines[2] != "4242" {
			t.Fatalf("got %q, want uid 4242 owning its terminal", lines)
		}
		groups := strings.Fields(lines[1])
		slices.Sort(groups)
		if want := []string{"4201", "4202", "4243"}; !slices.Equal(groups, want) {
			t.Errorf("id -G: got %q, want %q", groups, want)
		}
	})
}

func TestConfigureUser(t *testing.T) {
	requiresUserSwitch(t)
	a := newUserTestAgent(t)
	wd := openDir(t)
	out := filepath.Join(wd, "out")
	if err := os.Mkdir(out, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(out, 0o777); err != nil { // past the umask
		t.Fatal(err)
	}
	err := a.configure(t, &agentv1.ConfigureRequest{
		Env:     []string{"FOO=bar"},
		Workdir: wd,
		User:    "sbxtest",
		Command: []string{"sh", "-c", `echo "$(id -u) $(id -g) $HOME $USER $FOO" > out/tmp && mv out/tmp out/entrypoint`},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := waitFile(t, filepath.Join(out, "entrypoint")), "4242 4243 /home/sbxtest sbxtest bar\n"; got != want {
		t.Errorf("entrypoint: got %q, want %q", got, want)
	}
	idu := func(user string) string {
		return strings.TrimSpace(a.mustRun(t, &sbxv1.ExecRequest{Shell: `echo "$(id -u):$(id -g) $HOME"`, User: user}))
	}
	// The configured user is the default; an exec's user beats it.
	for user, want := range map[string]string{
		"":          "4242:4243 /home/sbxtest",
		"root":      "0:0 /root",
		"0":         "0:0 /root",
		"nohome":    "4300:4300 /",
		"4242:4201": "4242:4201 /home/sbxtest",
	} {
		if got := idu(user); got != want {
			t.Errorf("exec user %q: got %q, want %q", user, got, want)
		}
	}
	// A later Configure without a user makes root the default again.
	if err := a.configure(t, &agentv1.ConfigureRequest{Workdir: wd}); err != nil {
		t.Fatal(err)
	}
	if got, want := idu(""), "0:0 /root"; got != want {
		t.Errorf("after reconfigure without user: got %q, want %q", got, want)
	}
}

// TestUnknownUser needs no root: the user is resolved before anything starts.
func TestUnknownUser(t *testing.T) {
	a := newUserTestAgent(t)
	tests := []struct {
		user string
		want string
	}{
		{user: "bob", want: `user "bob": no such user in `},
		{user: "sbxtest:nogroup", want: `user "sbxtest:nogroup": no such group "nogroup" in `},
		{user: ":4201", want: "empty user name"},
	}
	for _, tt := range tests {
		t.Run(tt.user, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			stream := a.conn.Exec(ctx)
			stream.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Start{Start: &sbxv1.ExecRequest{Argv: []string{"true"}, User: tt.user}}})
			res, err := collect(stream)
			if got, want := connect.CodeOf(err), connect.CodeInvalidArgument; got != want {
				t.Fatalf("exec: code %v (%v), want %v", got, err, want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("exec: error %q, want it to contain %q", err, tt.want)
			}
			if res.pid != 0 {
				t.Errorf("exec: started pid %d, want nothing started", res.pid)
			}

			marker := filepath.Join(t.TempDir(), "ran")
			err = a.configure(t, &agentv1.ConfigureRequest{Env: []string{"CHANGED=1"}, User: tt.user, Command: []string{"touch", marker}})
			if got, want := connect.CodeOf(err), connect.CodeInvalidArgument; got != want {
				t.Fatalf("configure: code %v (%v), want %v", got, err, want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("configure: error %q, want it to contain %q", err, tt.want)
			}
			time.Sleep(50 * time.Millisecond)
			if _, err := os.Stat(marker); err == nil {
				t.Error("configure: the command ran")
			}
		})
	}
	// Nothing was applied.
	if res := a.run(t, &sbxv1.ExecRequest{Shell: `echo "$SBX_TEST [$CHANGED] $(id -u)"`}); res.stdout != "base [] "+strconv.Itoa(os.Geteuid())+"\n" {
		t.Errorf("after rejected users: got %q", res.stdout)
	}
}

func TestOwnEnvDropsRootHome(t *testing.T) {
	t.Setenv("HOME", "/root")
	if env := ownEnv(); envHas(env, "HOME") {
		t.Errorf("HOME=/root kept: %q", env)
	}
	t.Setenv("HOME", "/custom")
	if got := envLookup(ownEnv(), "HOME"); got != "/custom" {
		t.Errorf("HOME: got %q, want /custom", got)
	}
}

// TestUserDBRefusesMagicLinks: the sandbox's /etc/passwd is the box's to
// make; a link to the agent's own handles (/proc/self/fd/N, environ) or a
// FIFO must not be read, a plain symlink still is.
func TestUserDBRefusesMagicLinks(t *testing.T) {
	dir := t.TempDir()
	hidden := filepath.Join(dir, "hidden")
	if err := os.WriteFile(hidden, []byte("secret:x:4242:4242::/secret:/bin/sh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(hidden)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	plain := filepath.Join(dir, "passwd.real")
	if err := os.WriteFile(plain, []byte("alice:x:1000:1000::/home/alice:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := func(name, target string) string {
		p := filepath.Join(dir, name)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, passwd, spec string
		ok                 bool
	}{
		{"plain symlink", link("p1", plain), "alice", true},
		{"agent fd", link("p2", fmt.Sprintf("/proc/self/fd/%d", f.Fd())), "secret", false},
		{"agent environ", link("p3", "/proc/self/environ"), "secret", false},
		{"via a plain link to a magic one", link("p4", filepath.Join(dir, "p2")), "secret", false},
		{"fifo", fifo, "alice", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, err := lookupUser(tc.spec, tc.passwd, filepath.Join(dir, "nogroup"))
			if tc.ok != (err == nil) {
				t.Fatalf("lookupUser(%q) in %s = %+v, %v; want ok=%v", tc.spec, tc.passwd, u, err, tc.ok)
			}
		})
	}
}
