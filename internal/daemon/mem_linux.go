package daemon

import (
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// totalMemory is the host's RAM in bytes.
func totalMemory() int64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 64 << 30
	}
	return int64(si.Totalram) * int64(si.Unit)
}

// maxBoxPids is the most PIDs one sandbox may ask for: half of what the
// kernel can hand out (kernel.pid_max, kernel.threads-max), so one box
// cannot take the host's whole pid table.
func maxBoxPids() int64 {
	lim := int64(1 << 22)
	for _, f := range []string{"/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max"} {
		if b, err := os.ReadFile(f); err == nil {
			if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && v > 0 {
				lim = min(lim, v)
			}
		}
	}
	return lim / 2
}
