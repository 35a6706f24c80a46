//go:build !linux

package daemon

// totalMemory is a generous stand-in off Linux, where the daemon cannot run
// sandboxes anyway.
func totalMemory() int64 { return 64 << 30 }

func maxBoxPids() int64 { return 1 << 21 }
