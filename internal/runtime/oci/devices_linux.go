//go:build linux

package oci

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// narrowDevices makes box id's v1 device cgroup allow exactly what
// boxDevices allows. Both runtimes add defaults of their own to a
// config's device rules: runc 1.1 /dev/net/tun (c 10:200 rwm), crun
// /dev/console (c 5:1 rwm), and both mknod of every device (c *:* m,
// b *:* m). Each rule the cgroup's devices.list holds beyond boxDevices is
// written to devices.deny, then the list is read back and compared. It
// runs once the runtime has made the box, before any of the box's own
// code: a denied rule leaves open descriptors working, and the agent opens
// none of these devices. On a cgroup2 devices controller (an eBPF program
// the runtime attached) there is no list to edit, and it does nothing.
func (l cgroupLayout) narrowDevices(id string) error {
	mp, ok := l.v1["devices"]
	if !ok {
		return nil
	}
	dir := filepath.Join(mp, l.parent, id)
	want := map[string]bool{}
	for _, d := range boxDevices() {
		if d.Allow {
			want[deviceRule(d)] = true
		}
	}
	extra, err := extraDeviceRules(dir, want)
	if err != nil {
		return err
	}
	for _, r := range extra {
		if strings.HasPrefix(r, "a ") {
			// Denying it would deny every device, the box's own too.
			return fmt.Errorf("box %s: device cgroup allows every device (%q)", id, r)
		}
		if err := os.WriteFile(filepath.Join(dir, "devices.deny"), []byte(r), 0); err != nil {
			return fmt.Errorf("deny device rule %q for box %s: %w", r, id, err)
		}
	}
	if extra, err = extraDeviceRules(dir, want); err != nil {
		return err
	}
	if len(extra) > 0 {
		return fmt.Errorf("box %s: device cgroup still allows %s after denying them", id, strings.Join(extra, ", "))
	}
	return nil
}

// extraDeviceRules lists the rules of the device cgroup at dir that are
// not in want.
func extraDeviceRules(dir string, want map[string]bool) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "devices.list"))
	if err != nil {
		return nil, fmt.Errorf("read box device cgroup: %w", err)
	}
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line = strings.TrimSpace(line); line != "" && !want[line] {
			out = append(out, line)
		}
	}
	return out, nil
}

// deviceRule is d as a v1 devices.list line ("c 136:* rwm").
func deviceRule(d specs.LinuxDeviceCgroup) string {
	num := func(n *int64) string {
		if n == nil || *n < 0 {
			return "*"
		}
		return strconv.FormatInt(*n, 10)
	}
	typ := d.Type
	if typ == "" {
		typ = "a"
	}
	return fmt.Sprintf("%s %s:%s %s", typ, num(d.Major), num(d.Minor), d.Access)
}
