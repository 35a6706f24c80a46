package oci

import (
	"testing"
)

func TestKmemAccounted(t *testing.T) {
	for _, tc := range []struct {
		cmdline string
		want    bool
	}{
		{"console=ttyS0 quiet", true},
		{"cgroup.memory=nokmem quiet", false},
		{"cgroup.memory=nosocket,nokmem", false},
		{"cgroup.memory=nosocket", true},
		// After "--" the words are init's, not the kernel's.
		{"quiet -- cgroup.memory=nokmem", true},
	} {
		if got := kmemAccounted(tc.cmdline); got != tc.want {
			t.Errorf("kmemAccounted(%q) = %v, want %v", tc.cmdline, got, tc.want)
		}
	}
}

func TestBoxNoFile(t *testing.T) {
	for _, tc := range []struct {
		name string
		ft   fileTable
		cap  uint64
		pids int64
		want uint64
	}{
		{"bounded: the driver's limit", fileTable{bounded: true}, 1 << 20, 512, 1 << 20},
		{"shared: an eighth of file-max over the pids", fileTable{max: 2466177}, 1 << 20, 64, 2466177 / 8 / 64},
		{"shared: never below 1024", fileTable{max: 2466177}, 1 << 20, 512, 1024},
		{"shared: never above the driver's limit", fileTable{max: 1 << 40}, 20000, 16, 20000},
		{"shared: no pids limit", fileTable{max: 2466177}, 1 << 20, 0, 1024},
	} {
		if got := boxNoFile(tc.ft, tc.cap, tc.pids); got != tc.want {
			t.Errorf("%s: got %d, want %d", tc.name, got, tc.want)
		}
	}
}
