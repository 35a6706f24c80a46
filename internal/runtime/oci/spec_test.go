package oci

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sbxdev/sbx/internal/hostimage"
	"github.com/sbxdev/sbx/internal/idmap"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/ocibox"
	"github.com/sbxdev/sbx/internal/testutil"
)

func TestBuildSpec(t *testing.T) {
	s := buildSpec(specParams{
		ID: "b1", CgroupParent: "sbx", Hostname: "h", Command: []string{"sleep", "1"}, Env: []string{"A=1"}, Workdir: "/w",
		Resources: runtime.Resources{MemoryBytes: 64 << 20, CPUMillis: 500, Pids: 100},
		HostImage: true, AgentPath: "/x/sbx-agent", SwapLimit: true,
	})
	if diff := cmp.Diff([]string{agentInBox, "--listen-fd", "3", "--ready-fd", "4", "--exec-fd", "5", "--", "sleep", "1"}, s.Process.Args); diff != "" {
		t.Errorf("args (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"A=1", ocibox.DefaultPath}, s.Process.Env); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}
	if s.Process.OOMScoreAdj != nil {
		t.Errorf("oomScoreAdj = %d, want unset", *s.Process.OOMScoreAdj)
	}
	if !s.Process.NoNewPrivileges {
		t.Errorf("noNewPrivileges = false")
	}
	// CAP_SYS_ADMIN is the agent's (it drops it before starting anything).
	for _, forbidden := range []string{"CAP_NET_RAW", "CAP_SYS_PTRACE", "CAP_MKNOD", "CAP_SYS_MODULE"} {
		if slices.Contains(s.Process.Capabilities.Bounding, forbidden) {
			t.Errorf("bounding set has %s", forbidden)
		}
	}
	if s.Process.Capabilities.Inheritable != nil || s.Process.Capabilities.Ambient != nil {
		t.Errorf("inheritable/ambient capabilities set")
	}
	var nss []specs.LinuxNamespaceType
	for _, ns := range s.Linux.Namespaces {
		nss = append(nss, ns.Type)
	}
	for _, want := range []specs.LinuxNamespaceType{specs.PIDNamespace, specs.MountNamespace, specs.IPCNamespace,
		specs.UTSNamespace, specs.NetworkNamespace, specs.UserNamespace, specs.CgroupNamespace} {
		if !slices.Contains(nss, want) {
			t.Errorf("namespace %s missing", want)
		}
	}
	r := s.Linux.Resources
	if *r.Memory.Limit != 64<<20 || *r.Memory.Swap != 64<<20 {
		t.Errorf("memory limit/swap = %d/%d, want both 64 MiB", *r.Memory.Limit, *r.Memory.Swap)
	}
	// The box starts at the most weight; Create lowers it to 512 (half a
	// CPU) once the agent is ready (startboost.go).
	if *r.CPU.Quota != 50000 || *r.CPU.Period != 100000 || *r.CPU.Shares != 262144 {
		t.Errorf("cpu quota/period/shares = %d/%d/%d, want 50000/100000/262144", *r.CPU.Quota, *r.CPU.Period, *r.CPU.Shares)
	}
	if *r.Pids.Limit != 100 {
		t.Errorf("pids limit = %d, want 100", *r.Pids.Limit)
	}
	if s.Linux.CgroupsPath != "/sbx/b1" {
		t.Errorf("cgroupsPath = %q, want /sbx/b1", s.Linux.CgroupsPath)
	}
	var usr, agent bool
	for _, m := range s.Mounts {
		switch m.Destination {
		case "/usr":
			usr = slices.Contains(m.Options, "ro") && slices.Contains(m.Options, "nosuid")
		case agentInBox:
			agent = m.Source == "/x/sbx-agent" && slices.Contains(m.Options, "ro")
		}
	}
	if !usr || !agent {
		t.Errorf("read-only /usr bind %v, read-only agent bind %v; want both", usr, agent)
	}
}

// With AgentSeccomp the agent installs the filter: the runtime gets none.
func TestBuildSpecAgentSeccomp(t *testing.T) {
	for _, agent := range []bool{false, true} {
		s := buildSpec(specParams{ID: "b1", CgroupParent: "sbx", AgentPath: "/x/sbx-agent", AgentSeccomp: agent})
		if got := slices.Contains(s.Process.Args, "--seccomp"); got != agent {
			t.Errorf("AgentSeccomp %v: --seccomp in args = %v, want %v", agent, got, agent)
		}
		if got := s.Linux.Seccomp != nil; got == agent {
			t.Errorf("AgentSeccomp %v: runtime profile set = %v, want %v", agent, got, !agent)
		}
		if !s.Process.NoNewPrivileges {
			t.Errorf("AgentSeccomp %v: no_new_privs off", agent)
		}
	}
}

func TestHostImage(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	root, err := hostimage.Ensure(dir, int(idmap.Canonical.Base), int(idmap.Canonical.Base))
	if err != nil {
		t.Fatal(err)
	}
	if again, err := hostimage.Ensure(dir, int(idmap.Canonical.Base), int(idmap.Canonical.Base)); err != nil || again != root {
		t.Fatalf("second ensureHostImage = %q, %v; want %q", again, err, root)
	}
	for _, secret := range []string{"shadow", "gshadow", "ssh", "sudoers", "environment", "machine-id", "ssl/private"} {
		if _, err := os.Lstat(filepath.Join(root, "etc", secret)); err == nil {
			t.Errorf("host image has /etc/%s", secret)
		}
	}
	if link, err := os.Readlink(filepath.Join(root, "bin")); err != nil || link != "usr/bin" {
		t.Errorf("/bin -> %q (%v), want usr/bin", link, err)
	}
	fi, err := os.Stat(filepath.Join(root, "tmp"))
	if err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("/tmp mode = %v (%v), want sticky 0777", fi.Mode(), err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("images dir has %d entries, want only the image (no temp dirs)", len(ents))
	}
}
