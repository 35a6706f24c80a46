//go:build !sbxcrashpoints

package crashpoint

import "context"

// Hit marks crash point name; without the sbxcrashpoints build tag it does
// nothing.
func Hit(name string) {}

// Enabled reports whether crash points are compiled in.
const Enabled = false

// Pause marks pause point name; without the sbxcrashpoints build tag it
// does nothing.
func Pause(ctx context.Context, name, detail string) {}
