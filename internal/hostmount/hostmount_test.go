package hostmount

import (
	"slices"
	"strings"
	"testing"
)

func TestParseLine(t *testing.T) {
	for _, tc := range []struct {
		line string
		want Entry
		ok   bool
	}{
		{`36 35 98:0 /mnt1 /mnt\040two rw,noatime master:1 - ext3 /dev/root rw,errors=continue`,
			Entry{MountPoint: "/mnt two", FSType: "ext3", SuperOpts: "rw,errors=continue"}, true},
		{`30 24 0:26 / /sys/fs/cgroup/cpu rw,nosuid shared:9 - cgroup cgroup rw,cpu`,
			Entry{MountPoint: "/sys/fs/cgroup/cpu", FSType: "cgroup", SuperOpts: "rw,cpu"}, true},
		{`31 24 0:27 / /x rw - tmpfs`, Entry{}, false},
		{`garbage`, Entry{}, false},
		{`1 2 3:4 / /a\134b\012c rw - tmpfs t rw`, Entry{MountPoint: "/a\\b\nc", FSType: "tmpfs", SuperOpts: "rw"}, true},
	} {
		got, ok := ParseLine(tc.line)
		if ok != tc.ok || got != tc.want {
			t.Errorf("ParseLine(%q) = %+v, %v; want %+v, %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
}

func TestUnder(t *testing.T) {
	mi := strings.Join([]string{
		`1 0 0:1 / / rw - ext4 /dev/root rw`,
		`2 1 0:2 / /box rw - tmpfs t rw`,
		`3 2 0:3 / /box/a rw - tmpfs t rw`,
		`4 3 0:4 / /box/a/deep rw - tmpfs t rw`,
		`5 1 0:5 / /boxes rw - tmpfs t rw`,
		`6 2 0:6 / /box/b\040c rw - tmpfs t rw`,
	}, "\n")
	mounts, err := parse(strings.NewReader(mi))
	if err != nil {
		t.Fatal(err)
	}
	got := under(mounts, "/box/")
	want := []string{"/box/a/deep", "/box/b c", "/box/a", "/box"}
	if !slices.Equal(got, want) {
		t.Fatalf("under(/box/) = %q, want %q (at or below, deepest first, not /boxes)", got, want)
	}
}
