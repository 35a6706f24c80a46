//go:build !sbxcrashpoints

package crashpoint

// Hit marks crash point name; without the sbxcrashpoints build tag it does
// nothing.
func Hit(name string) {}

// Enabled reports whether crash points are compiled in.
const Enabled = false
