package integration

import (
	_ "embed"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

//go:embed testdata/permprobe.py
var permProbe string

// permTree fills a volume with the test tree (through a first sandbox) and
// returns its name.
func permTree(t *testing.T, d *daemon) string {
	t.Helper()
	ctx := ctxT(t, 2*time.Minute)
	c := d.client()
	if _, err := c.CreateVolume(ctx, "tree", 32<<20); err != nil {
		t.Fatal(err)
	}
	sb, err := c.Create(ctx, sbx.CreateOptions{Volumes: []sbx.VolumeMount{{Volume: "tree", Path: "/t"}}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	mustRun(t, ctx, sb, `cd /t && mkdir -p secrets src output && echo SECRET=1 > .env && echo s > secrets/x &&
		echo k > a.key && echo 'package main' > src/main.go && echo o > output/keep && echo hello > README && sync`)
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	return "tree"
}

var agentSafeGuard = sbx.PathPolicy{Path: "/workspace", Preset: "agent-safe", Rules: []sbx.PermissionRule{
	{Pattern: "/README", Type: sbx.File, Permission: sbx.PermView, Priority: 50},
}}

// TestPathPermissions checks each permission and each trick to get around
// them, from inside the sandbox (python3 doing the syscalls) and through
// the daemon's file API.
func TestPathPermissions(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	c := d.client()
	vol := permTree(t, d)

	// Bad policies are refused before anything starts.
	for name, p := range map[string]sbx.PathPolicy{
		"relative":       {Path: "workspace"},
		"root":           {Path: "/"},
		"proc":           {Path: "/proc/x"},
		"unknown preset": {Path: "/w", Preset: "nope"},
		"bad pattern":    {Path: "/w", Rules: []sbx.PermissionRule{{Pattern: "[", Permission: sbx.PermNone}}},
		"no permission":  {Path: "/w", Rules: []sbx.PermissionRule{{Pattern: "x"}}},
	} {
		_, err := c.Create(ctx, sbx.CreateOptions{PathPolicies: []sbx.PathPolicy{p}})
		wantCode(t, name, err, connect.CodeInvalidArgument)
	}

	sb, err := c.Create(ctx, sbx.CreateOptions{
		Volumes:      []sbx.VolumeMount{{Volume: vol, Path: "/workspace"}},
		PathPolicies: []sbx.PathPolicy{agentSafeGuard},
		// The entrypoint must start only once the guard is up.
		Command: []string{"sh", "-c", "ls -a /workspace > /tmp/entry.txt; sleep 600"},
	})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	if got := sb.Info.GetPathPolicies(); len(got) != 1 || got[0].GetPreset() != "agent-safe" {
		t.Errorf("sandbox path policies: got %v, want the agent-safe guard", got)
	}
	waitFor(t, func() bool {
		r, err := sb.RunShell(ctx, "test -s /tmp/entry.txt")
		return err == nil && r.Code == 0
	})
	if got := mustRun(t, ctx, sb, "cat /tmp/entry.txt"); strings.Contains(got, ".env") || !strings.Contains(got, "src") {
		t.Errorf("the entrypoint saw %q, want the guarded view (src, no .env)", got)
	}

	if err := sb.WriteFile(ctx, "/tmp/probe.py", []byte(permProbe), 0o644); err != nil {
		t.Fatal(err)
	}
	out := mustRun(t, ctx, sb, "/usr/bin/python3 /tmp/probe.py")
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(line, " ")
		got[k] = v
	}
	// Changes the kernel refuses before asking the agent (unlink, rename,
	// link, chmod of a READ or VIEW file) fail with EOVERFLOW, not EACCES:
	// such files are shown with an unmappable group so that the kernel
	// itself enforces their mode bits on open (see internal/agent/permfs).
	want := map[string]string{
		"list_env": "ENOENT", "list_secrets": "ENOENT", "list_key": "ENOENT", "list_src": "ok",
		"stat_env": "ENOENT", "read_env": "ENOENT", "read_secret": "ENOENT", "read_key": "ENOENT",
		"stat_readme_view": "ok", "read_readme_view": "EACCES",
		"read_src": "ok", "write_src": "EACCES", "create_src": "EACCES", "truncate_src": "EACCES",
		"chmod_src": "EOVERFLOW", "unlink_src": "EOVERFLOW", "mkdir_src": "EACCES",
		"write_output": "ok", "mkdir_output": "ok", "create_output_key": "EACCES", "setxattr_output": "ENOTSUP",
		"symlink_make": "ok", "symlink_rel_hidden": "ENOENT", "symlink_abs_hidden": "ENOENT",
		"symlink_dotdot_hidden": "ENOENT", "symlink_write_readonly": "EACCES", "symlink_read_readonly": "ok",
		"link_readonly": "EOVERFLOW", "link_view": "EOVERFLOW", "link_hidden": "ENOENT", "link_writable": "ok",
		"rename_readonly_in": "EOVERFLOW", "rename_over_hidden": "EACCES", "rename_into_hidden_dir": "ENOENT",
		"rename_dir_to_readonly": "EACCES", "rename_writable": "ok",
		"dotdot_hidden": "ENOENT", "dotdot_env": "ENOENT", "procroot_hidden": "ENOENT", "procroot_write": "EACCES",
		"mmap_write_readonly": "EACCES",
		"sysadmin_CapEff":     "clear", "sysadmin_CapBnd": "clear", "sysadmin_CapPrm": "clear",
		"umount_guard": "EPERM", "mount_tmpfs": "EPERM",
		"proc1_root": "EACCES", "proc1_fd_open": "EACCES", "proc1_fd_readlink": "EACCES", "proc1_fd_stat": "EACCES", "proc1_cwd": "EACCES",
		"unchanged": "ok",
	}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range want {
			if !yield(k) {
				return
			}
		}
	}) {
		if got[k] != want[k] {
			t.Errorf("%s: got %q, want %q", k, got[k], want[k])
		}
	}
	if t.Failed() {
		t.Logf("probe output:\n%s", out)
	}

	// The daemon's file API sees the same view.
	if _, err := sb.ReadFile(ctx, "/workspace/.env"); err == nil {
		t.Error("ReadFile of /workspace/.env succeeded")
	}
	if _, err := sb.ReadFile(ctx, "/workspace/README"); err == nil {
		t.Error("ReadFile of the view-only README succeeded")
	}
	if b, err := sb.ReadFile(ctx, "/workspace/src/main.go"); err != nil || string(b) != "package main\n" {
		t.Errorf("ReadFile src/main.go: got %q, %v", b, err)
	}
	if err := sb.WriteFile(ctx, "/workspace/src/evil", []byte("x"), 0o644); err == nil {
		t.Error("WriteFile into read-only src succeeded")
	}
	if err := sb.WriteFile(ctx, "/workspace/output/ok", []byte("x"), 0o644); err != nil {
		t.Errorf("WriteFile into output: %v", err)
	}
	// Other users: mode bits apply as on any file system, and what they
	// create is theirs.
	mustRun(t, ctx, sb, "mkdir /workspace/output/u && chown 1000:1000 /workspace/output/u && echo r > /workspace/output/private && chmod 600 /workspace/output/private")
	res, err := sb.RunOpts(ctx, sbx.ExecOptions{Argv: []string{"sh", "-c",
		"echo x > /workspace/output/u/mine && stat -c %u:%g /workspace/output/u/mine; cat /workspace/output/private; cat /workspace/.env; cat /workspace/src/main.go"},
		User: "1000:1000", Workdir: "/tmp"})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(res.Stdout); got != "1000:1000\npackage main\n" {
		t.Errorf("as uid 1000: got stdout %q (stderr %q), want the new file owned by 1000:1000 and only src/main.go readable", got, res.Stderr)
	}
	ents, err := sb.ListDir(ctx, "/workspace", true, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if n := e.GetPath(); strings.Contains(n, ".env") || strings.Contains(n, "secrets") || strings.HasSuffix(n, ".key") {
			t.Errorf("ListDir shows hidden %s", n)
		}
	}

	// The CLI: --guard and --rule, shown by inspect.
	out, errOut, code := d.cli("", "create", "--guard", "/w:read-only", "--rule", "/w:none:*.key", "--rule", "/w:write:/out:directory:5")
	if code != 0 {
		t.Fatalf("sbx create --guard: exit %d: %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	d.remember(id)
	out, _, _ = d.cli("", "inspect", id)
	for _, want := range []string{`"preset": "read-only"`, `"pattern": "*.key"`, `"type": "directory"`, `"priority": 5`} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect does not show %s:\n%s", want, out)
		}
	}
	if _, errOut, code := d.cli("", "create", "--rule", "/w:bogus:x"); code == 0 || !strings.Contains(errOut, "unknown permission") {
		t.Errorf("--rule with a bad permission: exit %d, stderr %q", code, errOut)
	}
	for _, ref := range []string{id, sb.ID} {
		if _, errOut, code := d.cli("", "rm", ref); code != 0 {
			t.Errorf("sbx rm %s: %s", ref, errOut)
		}
	}
	if err := c.RemoveVolume(ctx, vol); err != nil {
		t.Errorf("removing volume: %v", err)
	}
	d.assertNoLeaks()
}
