//go:build linux

package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/idmap"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/ocibox"
	"github.com/sbxdev/sbx/internal/safepath"
)

// boxCapabilities is Docker's default set (ocibox.Capabilities), as
// capabilities of gVisor's kernel, not the host's. No CAP_SYS_ADMIN: boxes
// get no path policies.
var boxCapabilities = ocibox.Capabilities

// pidsOverhead is added to a box's pids limit for runsc's own host
// threads (sentry, gofer, systrap stubs): runsc does not start at all under
// a pids.max of 128 or less, and exhausting the host pids kills the whole
// sandbox rather than failing one fork.
const pidsOverhead = 256

// noFile is every box's RLIMIT_NOFILE (gVisor's kernel enforces it).
const noFile = 1 << 20

// specParams is what the driver adds to a runtime.Spec for config.json.
type specParams struct {
	Rootfs      string
	HostImage   bool
	Agent       string
	RunDir      string
	TmpDir      string
	Mounts      []ocibox.Bind
	CgroupsPath string
	// AgentSeccomp has the agent install the seccomp profile (--seccomp)
	// rather than runsc (seccomp_linux.go).
	AgentSeccomp bool
}

func buildSpec(spec runtime.Spec, p specParams) *specs.Spec {
	hostname := spec.Hostname
	if hostname == "" {
		hostname = spec.ID
	}
	args := []string{agentInBox, "--listen", "unix:" + runInBox + "/agent.sock", "--exec", "unix:" + runInBox + "/exec.sock",
		"--ready-fd", "3", "--nofile", strconv.Itoa(noFile)}
	if p.AgentSeccomp {
		args = append(args, "--seccomp")
	}
	if len(spec.Command) > 0 {
		args = append(append(args, "--"), spec.Command...)
	}
	c := idmap.Canonical
	s := &specs.Spec{
		Version:  "1.0.2",
		Hostname: hostname,
		Root:     &specs.Root{Path: p.Rootfs},
		Process:  ocibox.Process(args, spec.Env, spec.Workdir, boxCapabilities),
		Mounts:   mounts(p),
		Linux: &specs.Linux{
			UIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: c.Base, Size: c.Size}},
			GIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: c.Base, Size: c.Size}},
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.UserNamespace}, networkNamespace(spec.Network),
			},
			CgroupsPath: p.CgroupsPath,
			Resources:   resources(spec.Resources),
		},
	}
	if !p.AgentSeccomp {
		// Installed in gVisor's kernel by runsc (--oci-seccomp), with
		// EPERM for every errno rule (seccomp_linux.go).
		s.Linux.Seccomp = ocibox.Seccomp()
	}
	return s
}

func mounts(p specParams) []specs.Mount {
	ms := append(ocibox.DevMounts(),
		specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}})
	if p.HostImage {
		ms = append(ms, ocibox.HostUsr())
	}
	// An explicit /tmp: runsc otherwise mounts a tmpfs of its own over an
	// empty /tmp, in the sandbox's memory and outside the disk limit. This
	// one is the rootfs overlay's own /tmp, on the box's disk (boxTmp).
	ms = append(ms,
		specs.Mount{Destination: "/tmp", Type: "bind", Source: p.TmpDir, Options: []string{"bind", "rw", "nosuid", "nodev"}},
		ocibox.AgentMount(p.Agent),
		specs.Mount{Destination: runInBox, Type: "bind", Source: p.RunDir, Options: []string{"bind", "rw", "nosuid", "nodev", "noexec"}},
	)
	return append(ms, ocibox.BindMounts(p.Mounts, true)...)
}

func resources(r runtime.Resources) *specs.LinuxResources {
	out := &specs.LinuxResources{}
	if r.MemoryBytes > 0 {
		out.Memory = &specs.LinuxMemory{Limit: &r.MemoryBytes}
	}
	if r.CPUMillis > 0 {
		period := uint64(100000)
		quota := r.CPUMillis * 100
		out.CPU = &specs.LinuxCPU{Period: &period, Quota: &quota}
	}
	if r.Pids > 0 {
		limit := r.Pids + pidsOverhead
		out.Pids = &specs.LinuxPids{Limit: &limit}
	}
	return out
}

// prepareRootfs writes the box's /etc/hostname, /etc/hosts and (with DNS)
// /etc/resolv.conf into its writable layer and makes its working directory,
// owned by the box's root (host uid root). The tree holds the image's
// files, so it is walked without following links (internal/safepath); an
// image whose /etc is a link keeps its own files.
func prepareRootfs(rootfs string, spec runtime.Spec, root int, log *slog.Logger) error {
	r, err := safepath.OpenRoot(rootfs)
	if err != nil {
		return fmt.Errorf("open rootfs: %w", err)
	}
	defer r.Close()
	files, err := ocibox.EtcFiles(spec)
	if err != nil {
		return err
	}
	if err := mkdirAll(r, "etc", root); err != nil {
		log.Debug("not writing into the image's /etc", "err", err)
	} else {
		for rel, content := range files {
			if err := writeFile(r, rel, content, root); err != nil {
				log.Debug("not writing into the image's /etc", "file", rel, "err", err)
			}
		}
	}
	if spec.Workdir != "" && spec.Workdir != "/" {
		if err := mkdirAll(r, strings.TrimPrefix(path.Clean(spec.Workdir), "/"), root); err != nil {
			return fmt.Errorf("working directory %s: %w", spec.Workdir, err)
		}
	}
	return nil
}

// mkdirAll makes rel and its missing parents inside r, owned by uid.
func mkdirAll(r *safepath.Root, rel string, uid int) error {
	cur := ""
	for _, part := range strings.Split(rel, "/") {
		if part == "" || part == "." {
			continue
		}
		cur = path.Join(cur, part)
		fi, err := r.Lstat(cur)
		switch {
		case err == nil && fi.IsDir():
			continue
		case err == nil:
			return fmt.Errorf("%s: not a directory", cur)
		case !errors.Is(err, fs.ErrNotExist):
			return err
		}
		if err := r.Mkdir(cur, 0o755); err != nil {
			return err
		}
		if err := r.Lchown(cur, uid, uid); err != nil {
			return err
		}
	}
	return nil
}

// writeFile replaces rel inside r with content, owned by uid.
func writeFile(r *safepath.Root, rel, content string, uid int) error {
	f, err := r.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(content)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return r.Lchown(rel, uid, uid)
}

// removeCgroups removes the cgroup dirs of box id under parent in every
// hierarchy: runsc leaves them when it is killed mid-way. Missing ones are
// fine.
func removeCgroups(parent, id string) error {
	var errs []error
	for _, root := range ocibox.CgroupRoots() {
		dir := filepath.Join(root, parent, id)
		if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTDIR) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}

// removeCgroupParent removes the driver's parent cgroup dirs that no box
// uses any more (a busy one stays).
func removeCgroupParent(parent string) {
	for _, root := range ocibox.CgroupRoots() {
		_ = unix.Rmdir(filepath.Join(root, parent))
	}
}

// killCgroup SIGKILLs every process in box id's cgroup (in any hierarchy
// that has it) until none is left or ctx ends.
func killCgroup(ctx context.Context, parent, id string) error {
	for {
		pids := cgroupPids(parent, id)
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kill the processes left in the cgroup of box %s (%v): %w", id, pids, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
