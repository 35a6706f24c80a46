package ocibox

import (
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// AgentInBox is where the agent binary is bound inside every box.
const AgentInBox = "/.sbx/sbx-agent"

// DefaultPath is the PATH of a box whose spec sets none. /usr/local/go/bin
// last: where Go is installed by its official archives (the host image
// shows the host's /usr, so its Go works in sandboxes).
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/go/bin"

// Capabilities is Docker's default capability set (no NET_RAW, SYS_PTRACE
// or MKNOD): what box root holds, in the box's user namespace (oci) or in
// gVisor's kernel (gvisor). A driver may add what only its agent holds.
var Capabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID",
	"CAP_SETUID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_AUDIT_WRITE",
	"CAP_SETFCAP",
}

// Process is the box's init process: args (the agent and its flags) as box
// root with caps in every set, no_new_privs, env with DefaultPath added if
// it sets no PATH, in workdir ("/" if empty).
func Process(args, env []string, workdir string, caps []string) *specs.Process {
	env = append([]string(nil), env...)
	hasPath := false
	for _, e := range env {
		hasPath = hasPath || strings.HasPrefix(e, "PATH=")
	}
	if !hasPath {
		env = append(env, DefaultPath)
	}
	if workdir == "" {
		workdir = "/"
	}
	caps = append([]string(nil), caps...)
	return &specs.Process{
		Args: args,
		Env:  env,
		Cwd:  workdir,
		User: specs.User{UID: 0, GID: 0},
		Capabilities: &specs.LinuxCapabilities{
			Bounding: caps, Effective: caps, Permitted: caps,
		},
		NoNewPrivileges: true,
	}
}

// DevMounts are /proc and the box's own /dev (a small tmpfs, its own pty
// instance and /dev/shm), every driver's first mounts.
func DevMounts() []specs.Mount {
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
	}
}

// HostUsr is the host image's /usr: the host's, read-only.
func HostUsr() specs.Mount {
	return specs.Mount{Destination: "/usr", Type: "bind", Source: "/usr", Options: []string{"rbind", "ro", "nosuid", "nodev"}}
}

// AgentMount binds the agent binary at src read-only at AgentInBox.
func AgentMount(src string) specs.Mount {
	return specs.Mount{Destination: AgentInBox, Type: "bind", Source: src, Options: []string{"bind", "ro", "nosuid", "nodev"}}
}
