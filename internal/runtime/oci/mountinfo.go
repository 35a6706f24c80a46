package oci

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// mountEntry is one line of /proc/self/mountinfo, reduced to what we use.
type mountEntry struct {
	MountPoint string
	FSType     string
	SuperOpts  string
}

// readMountinfo parses /proc/self/mountinfo.
func readMountinfo() ([]mountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if e, ok := parseMountinfoLine(sc.Text()); ok {
			out = append(out, e)
		}
	}
	return out, sc.Err()
}

// parseMountinfoLine parses "id parent maj:min root mountpoint opts [optional...] - fstype source superopts".
func parseMountinfoLine(line string) (mountEntry, bool) {
	fields := strings.Fields(line)
	sep := -1
	for i, f := range fields {
		if f == "-" && i >= 6 {
			sep = i
			break
		}
	}
	if sep < 0 || len(fields) < sep+3 {
		return mountEntry{}, false
	}
	e := mountEntry{MountPoint: unescapeMount(fields[4]), FSType: fields[sep+1]}
	if len(fields) > sep+3 {
		e.SuperOpts = fields[sep+3]
	}
	return e, true
}

// unescapeMount undoes the kernel's octal escaping (\040 for space etc.).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
