package builder

import (
	"bufio"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// unmountUnder lazily detaches every mount at or below dir (debootstrap
// mounts /proc and /sys in its target and may leave them on failure),
// deepest first, so that removing dir never reaches into them.
func unmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			points = append(points, fields[4])
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	var first error
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && first == nil {
			first = err
		}
	}
	return first
}
