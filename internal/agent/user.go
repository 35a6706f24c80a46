package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
)

// Users.
//
// A command runs as the user of its ExecRequest, else the sandbox's default
// user (set by Configure), else root. A user is given as docker's --user is:
// "name", "uid", "uid:gid", "name:group", "uid:group" or "name:gid". Names
// are resolved in the sandbox's own /etc/passwd and /etc/group (those under
// the agent's "/"), read by the small parser below on every exec, never
// through libc or NSS, so that users added by a command are found by the next.
//
// The rules are runc's (docker's):
//   - the user part is looked up by name, or by uid when it is numeric; the
//     first matching passwd line wins. A numeric uid that no line has is
//     used as is, with gid 0, no name and HOME "/" (as `docker run --user
//     1234` does); a name that no line has is an error.
//   - the group part, if any, is looked up likewise in /etc/group and
//     replaces the passwd entry's gid; a numeric gid no line has is used as
//     is, an unknown group name is an error.
//   - supplementary groups are, like initgroups(3), the primary gid and every
//     group in /etc/group that lists the user's name as a member (this differs
//     from docker, which drops them when a group is given explicitly).
//   - HOME defaults to the passwd entry's home directory ("/" when none; and
//     "/root" for uid 0 with no entry), USER and LOGNAME to the entry's name,
//     each only when the environment does not set it (an empty value counts
//     as unset). Without any user (the default root) only HOME=/root is
//     defaulted, as before users existed.
//
// The agent itself stays root: file operations (ReadFile, WriteFile, ListDir,
// UploadTar, ...) always run with the agent's own privileges, whatever the
// default user, and files they create are owned by root.

const (
	passwdFile = "/etc/passwd"
	groupFile  = "/etc/group"
)

// maxID is the largest valid uid or gid: (uint32)-1 means "unchanged" to
// the kernel.
const maxID = 1<<32 - 2

// userInfo is a resolved user.
type userInfo struct {
	spec   string // as given
	name   string // passwd name; "" when the uid has no entry
	uid    uint32
	gid    uint32
	groups []uint32 // supplementary groups, gid first
	home   string
}

// userError is a user that cannot be resolved; the caller reports it as
// InvalidArgument.
type userError struct {
	spec string
	msg  string
}

func (e *userError) Error() string { return fmt.Sprintf("user %q: %s", e.spec, e.msg) }

// parseID parses a decimal uid or gid; ok is false if s is not numeric.
func parseID(s string) (id uint32, ok bool, err error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false, nil
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n > maxID {
		return 0, true, fmt.Errorf("id %s is out of range", s)
	}
	return uint32(n), true, nil
}

// lookupUser resolves spec with the given passwd and group files (see the
// rules above). A missing file is as good as an empty one. It returns a
// *userError for a malformed or unknown user, another error if a file cannot
// be read.
func lookupUser(spec, passwdPath, groupPath string) (*userInfo, error) {
	bad := func(format string, args ...any) error {
		return &userError{spec: spec, msg: fmt.Sprintf(format, args...)}
	}
	if strings.ContainsAny(spec, "\x00\n") {
		return nil, bad("contains a NUL or newline")
	}
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	switch {
	case userPart == "":
		return nil, bad("empty user name")
	case hasGroup && groupPart == "":
		return nil, bad("empty group name")
	case strings.Contains(groupPart, ":"):
		return nil, bad("want user[:group]")
	}
	uid, uidNumeric, err := parseID(userPart)
	if err != nil {
		return nil, bad("%v", err)
	}
	u := &userInfo{spec: spec}
	pw, err := findPasswd(passwdPath, userPart, uid, uidNumeric)
	if err != nil {
		return nil, err
	}
	switch {
	case pw != nil:
		u.name, u.uid, u.gid, u.home = pw.name, pw.uid, pw.gid, pw.home
	case uidNumeric:
		u.uid = uid
	default:
		return nil, bad("no such user in %s", passwdPath)
	}
	if u.home == "" {
		u.home = "/"
		if u.uid == 0 && pw == nil {
			u.home = "/root"
		}
	}

	var groups []groupEntry
	var groupsErr error
	groupsRead := false
	readGroups := func() error {
		if !groupsRead {
			groupsRead = true
			groups, groupsErr = readGroupFile(groupPath)
		}
		return groupsErr
	}
	if hasGroup {
		gid, gidNumeric, err := parseID(groupPart)
		if err != nil {
			return nil, bad("%v", err)
		}
		if err := readGroups(); err != nil {
			return nil, err
		}
		i := slices.IndexFunc(groups, func(g groupEntry) bool {
			return g.name == groupPart || (gidNumeric && g.gid == gid)
		})
		switch {
		case i >= 0:
			u.gid = groups[i].gid
		case gidNumeric:
			u.gid = gid
		default:
			return nil, bad("no such group %q in %s", groupPart, groupPath)
		}
	}
	u.groups = []uint32{u.gid}
	if u.name != "" {
		if err := readGroups(); err != nil {
			return nil, err
		}
		for _, g := range groups {
			if slices.Contains(g.members, u.name) && !slices.Contains(u.groups, g.gid) {
				u.groups = append(u.groups, g.gid)
			}
		}
	}
	return u, nil
}

type passwdEntry struct {
	name     string
	uid, gid uint32
	home     string
}

// findPasswd returns the first entry of the passwd file named name or, if
// byUID, with that uid; nil if none.
func findPasswd(path, name string, uid uint32, byUID bool) (*passwdEntry, error) {
	var found *passwdEntry
	err := scanColonFile(path, func(f []string) bool {
		// name:password:uid:gid:gecos:home:shell
		if len(f) < 4 {
			return true
		}
		e := passwdEntry{name: f[0]}
		var ok bool
		if e.uid, ok = parseField(f[2]); !ok {
			return true
		}
		if e.gid, ok = parseField(f[3]); !ok {
			return true
		}
		if e.name != name && (!byUID || e.uid != uid) {
			return true
		}
		if len(f) > 5 {
			e.home = f[5]
		}
		found = &e
		return false
	})
	return found, err
}

type groupEntry struct {
	name    string
	gid     uint32
	members []string
}

// readGroupFile returns the valid entries of a group file.
func readGroupFile(path string) ([]groupEntry, error) {
	var groups []groupEntry
	err := scanColonFile(path, func(f []string) bool {
		// name:password:gid:member,member,...
		if len(f) < 3 {
			return true
		}
		g := groupEntry{name: f[0]}
		var ok bool
		if g.gid, ok = parseField(f[2]); !ok {
			return true
		}
		if len(f) > 3 {
			for m := range strings.SplitSeq(f[3], ",") {
				if m = strings.TrimSpace(m); m != "" {
					g.members = append(g.members, m)
				}
			}
		}
		groups = append(groups, g)
		return true
	})
	return groups, err
}

// parseField parses a numeric id field of a passwd or group line.
func parseField(s string) (uint32, bool) {
	id, ok, err := parseID(s)
	return id, ok && err == nil
}

// scanColonFile calls fn with the colon-separated fields of every line of
// path that has a name (comments, blank lines and NIS "+"/"-" lines are
// skipped) until fn returns false. A missing file has no lines.
func scanColonFile(path string, fn func(fields []string) bool) error {
	f, err := openUserDB(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading users: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := strings.TrimSuffix(sc.Text(), "\r")
		if line == "" || line[0] == '#' || line[0] == '+' || line[0] == '-' {
			continue
		}
		fields := strings.Split(line, ":")
		if fields[0] == "" {
			continue
		}
		if !fn(fields) {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading users: %s: %w", path, err)
	}
	return nil
}

// userEnv returns env with the user's defaults for HOME, USER and LOGNAME
// added where unset; u nil is the default root. env is not modified.
func userEnv(env []string, u *userInfo) []string {
	if u == nil {
		return setDefault(env, "HOME", "/root")
	}
	env = setDefault(env, "HOME", u.home)
	if u.name != "" {
		env = setDefault(env, "USER", u.name)
		env = setDefault(env, "LOGNAME", u.name)
	}
	return env
}

// canSearch reports whether u may traverse every directory of the absolute
// path dir, judged by the permission bits alone (ACLs are not consulted: it
// only picks the error message of a start that failed).
func canSearch(dir string, u *userInfo, stat func(string) (uid, gid, mode uint32, err error)) bool {
	if u == nil || u.uid == 0 {
		return true
	}
	paths := []string{"/"}
	p := ""
	for c := range strings.SplitSeq(dir, "/") {
		if c != "" {
			p += "/" + c
			paths = append(paths, p)
		}
	}
	for _, p := range paths {
		uid, gid, mode, err := stat(p)
		if err != nil {
			return true // not our explanation
		}
		var bit uint32
		switch {
		case uid == u.uid:
			bit = 0o100
		case slices.Contains(u.groups, gid):
			bit = 0o010
		default:
			bit = 0o001
		}
		if mode&bit == 0 {
			return false
		}
	}
	return true
}
