//go:build sbxcrashpoints

package crashpoint

import (
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
