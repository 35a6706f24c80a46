package ocibox

import (
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/hostimage"
	"github.com/sbxdev/sbx/internal/runtime"
)

// Lowers realises img as overlay lower dirs, lowest first: the image's
// unpacked layer dirs, on the built-in host image's skeleton (made once
// under imagesDir, owned by root, the host uid of box root in stored
// trees) if img.Host is set. host reports whether the host's /usr is to be
// bound read-only over the skeleton's. Layer dirs must exist; errors wrap
// errdefs.ErrInvalidArgument.
func Lowers(imagesDir string, img runtime.Image, root int) (lowers []string, host bool, err error) {
	if err := img.Validate(); err != nil {
		return nil, false, err
	}
	for _, l := range img.Layers {
		fi, err := os.Stat(l.Dir)
		if err != nil || !fi.IsDir() {
			return nil, false, fmt.Errorf("image %q layer %s: %q is not a directory: %w", img.Ref, l.Digest, l.Dir, errdefs.ErrInvalidArgument)
		}
	}
	lowers = img.LayerDirs()
	if img.Host == nil {
		return lowers, false, nil
	}
	dir, err := hostimage.Ensure(imagesDir, root, root)
	if err != nil {
		return nil, false, err
	}
	return append([]string{dir}, lowers...), true, nil
}

// EtcFiles are the per-box files a driver writes into the box's /etc
// (paths relative to the root): hostname and hosts naming the box
// (spec.Hostname, default its id), and resolv.conf when the network names
// DNS servers. Bad servers are errdefs.ErrInvalidArgument.
func EtcFiles(spec runtime.Spec) (map[string]string, error) {
	hostname := spec.Hostname
	if hostname == "" {
		hostname = spec.ID
	}
	files := map[string]string{
		"etc/hostname": hostname + "\n",
		"etc/hosts":    "127.0.0.1\tlocalhost " + hostname + "\n::1\tlocalhost ip6-localhost ip6-loopback\n",
	}
	if dns := spec.Network.Nameservers(); len(dns) > 0 {
		var rc strings.Builder
		for _, ns := range dns {
			if net.ParseIP(ns) == nil {
				return nil, fmt.Errorf("dns server %q: %w", ns, errdefs.ErrInvalidArgument)
			}
			rc.WriteString("nameserver " + ns + "\n")
		}
		files["etc/resolv.conf"] = rc.String()
	}
	return files, nil
}
