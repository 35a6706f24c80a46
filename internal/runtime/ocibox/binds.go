// Package ocibox is what sbx's drivers over OCI runtimes share: the oci
// driver (runc, crun) and the gvisor driver (runsc) make a box dir the same
// way (box.go), realise an image as overlay lower dirs (rootfs.go), show a
// box the same standard mounts, capabilities and seccomp profile in its
// config.json (spec.go, binds.go, seccomp.go) and keep its processes in a
// cgroup /<parent>/<id> in every hierarchy, which the leak probes read
// (cgroups_linux.go). What differs between them (namespaces, id mappings,
// how the runtime is run, the agent's endpoint) stays in each driver. Only
// drivers import it.
package ocibox

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Bind is a host directory (or file) shown in a box: what a driver made of
// a runtime.Mount (an idmapped bind, an overlay it mounted, a volume's dir)
// or of the image (the host's /usr).
type Bind struct {
	Source, Destination string
	ReadOnly            bool
}

// BindMounts returns binds as OCI mounts, nosuid and nodev, recursive
// ("rbind") or not.
func BindMounts(binds []Bind, recursive bool) []specs.Mount {
	kind := "bind"
	if recursive {
		kind = "rbind"
	}
	out := make([]specs.Mount, 0, len(binds))
	for _, b := range binds {
		rw := "rw"
		if b.ReadOnly {
			rw = "ro"
		}
		out = append(out, specs.Mount{Destination: b.Destination, Type: "bind", Source: b.Source, Options: []string{kind, rw, "nosuid", "nodev"}})
	}
	return out
}
