// Package hostmount owns the daemon's small dealings with the host's mount
// table that every driver and the codebase store share: reading
// /proc/self/mountinfo (with the kernel's octal escapes undone), listing
// the mounts below a directory, mounting a size-bound tmpfs and unmounting
// without caring whether something is mounted. Leaf: x/sys only.
package hostmount

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Entry is one line of /proc/self/mountinfo, reduced to what sbx uses.
type Entry struct {
	MountPoint string
	FSType     string
	SuperOpts  string
}

// Read parses /proc/self/mountinfo.
func Read() ([]Entry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	return parse(f)
}

func parse(r io.Reader) ([]Entry, error) {
	var out []Entry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if e, ok := ParseLine(sc.Text()); ok {
			out = append(out, e)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return out, nil
}

// ParseLine parses "id parent maj:min root mountpoint opts [optional...] -
// fstype source superopts"; ok is false for a line of another shape.
func ParseLine(line string) (e Entry, ok bool) {
	fields := strings.Fields(line)
	sep := -1
	for i, f := range fields {
		if f == "-" && i >= 6 {
			sep = i
			break
		}
	}
	if sep < 0 || len(fields) < sep+3 {
		return Entry{}, false
	}
	e = Entry{MountPoint: Unescape(fields[4]), FSType: fields[sep+1]}
	if len(fields) > sep+3 {
		e.SuperOpts = fields[sep+3]
	}
	return e, true
}

// Unescape undoes the kernel's octal escapes in mountinfo (\040 for a
// space, \012 for a newline, \134 for a backslash).
func Unescape(s string) string {
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

// Under lists the mount points at or below dir, deepest first (the order
// to unmount them in).
func Under(dir string) ([]string, error) {
	mounts, err := Read()
	if err != nil {
		return nil, err
	}
	return under(mounts, dir), nil
}

func under(mounts []Entry, dir string) []string {
	dir = filepath.Clean(dir)
	var out []string
	for _, m := range mounts {
		if m.MountPoint == dir || strings.HasPrefix(m.MountPoint, dir+"/") {
			out = append(out, m.MountPoint)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}
