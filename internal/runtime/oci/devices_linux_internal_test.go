//go:build linux

package oci

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestDeviceRule(t *testing.T) {
	n := func(v int64) *int64 { return &v }
	for _, tc := range []struct {
		d    specs.LinuxDeviceCgroup
		want string
	}{
		{charDev(1, 3), "c 1:3 rwm"},
		{charDev(136, -1), "c 136:* rwm"},
		{specs.LinuxDeviceCgroup{Type: "b", Access: "m"}, "b *:* m"},
		{specs.LinuxDeviceCgroup{Access: "rwm"}, "a *:* rwm"},
		{specs.LinuxDeviceCgroup{Type: "c", Major: n(5), Minor: n(1), Access: "rw"}, "c 5:1 rw"},
	} {
		if got := deviceRule(tc.d); got != tc.want {
			t.Errorf("deviceRule(%+v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

// TestExtraDeviceRules: the rules of a devices.list beyond boxDevices are
// the ones crun (c 5:1) and runc (c 10:200) add, and mknod of everything.
func TestExtraDeviceRules(t *testing.T) {
	want := map[string]bool{}
	for _, d := range boxDevices() {
		if d.Allow {
			want[deviceRule(d)] = true
		}
	}
	dir := t.TempDir()
	list := "c *:* m\nb *:* m\nc 1:3 rwm\nc 1:5 rwm\nc 1:7 rwm\nc 1:8 rwm\nc 1:9 rwm\nc 5:0 rwm\nc 5:1 rwm\nc 5:2 rwm\nc 10:200 rwm\nc 10:229 rwm\nc 136:* rwm\n"
	if err := os.WriteFile(filepath.Join(dir, "devices.list"), []byte(list), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := extraDeviceRules(dir, want)
	if err != nil {
		t.Fatal(err)
	}
	if exp := []string{"c *:* m", "b *:* m", "c 5:1 rwm", "c 10:200 rwm"}; !slices.Equal(got, exp) {
		t.Errorf("extraDeviceRules = %q, want %q", got, exp)
	}
	if _, err := extraDeviceRules(filepath.Join(dir, "missing"), want); err == nil {
		t.Error("extraDeviceRules of a missing cgroup: no error")
	}
}
