package daemon

import "golang.org/x/sys/unix"

// totalMemory is the host's RAM in bytes.
func totalMemory() int64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 64 << 30
	}
	return int64(si.Totalram) * int64(si.Unit)
}
