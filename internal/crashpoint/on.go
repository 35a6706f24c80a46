//go:build sbxcrashpoints

package crashpoint

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// Enabled reports whether crash points are compiled in.
const Enabled = true

var armed = sync.OnceValues(func() (map[string]bool, string) {
	dir := os.Getenv("SBX_CRASHPOINT_DIR")
	list := os.Getenv("SBX_CRASHPOINTS")
	if dir == "" || list == "" {
		return nil, ""
	}
	names := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		names[strings.TrimSpace(n)] = true
	}
	return names, dir
})

// Hit blocks forever if name is armed (see the package comment), after
// saying so with a file named after it.
func Hit(name string) {
	names, dir := armed()
	if !names[name] && !names["*"] {
		return
	}
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err == nil {
		f.WriteString("hit\n")
		f.Close()
	}
	select {}
}

var pausing = sync.OnceValue(func() map[string]bool {
	list := os.Getenv("SBX_PAUSEPOINTS")
	if os.Getenv("SBX_CRASHPOINT_DIR") == "" || list == "" {
		return nil
	}
	names := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		names[strings.TrimSpace(n)] = true
	}
	return names
})

// Pause blocks until ctx ends if name is armed in SBX_PAUSEPOINTS, after
// writing detail to the file named after it (see the package comment).
func Pause(ctx context.Context, name, detail string) {
	if !pausing()[name] {
		return
	}
	dir := os.Getenv("SBX_CRASHPOINT_DIR")
	if err := os.WriteFile(filepath.Join(dir, name), []byte(detail+"\n"), 0o600); err != nil {
		return
	}
	<-ctx.Done()
}
