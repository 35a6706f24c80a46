package agent

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const testPasswd = `# a comment, then a blank line

root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
alice:x:1000:1000:Alice:/home/alice:/bin/sh
nohome:x:1001:1001
1002:x:3000:3000:named like a uid:/home/num:/bin/sh
bob2:x:1002:1002::/home/bob2:/bin/sh
broken:x:notanumber:1::/:
emptyhome:x:1:1:::
+nisuser
:x:7:7::/:
crlf:x:1003:1003::/home/crlf:/bin/sh` + "\r\n"

const testGroup = `# groups
root:x:0:
alice:x:1000:
staff:x:50:alice,bob2
wheel:x:10:root, alice
dev:x:2000:
1000:x:4000:
broken:x:nan:alice
empty:x:60:
other:x:70:bob2,alicia
`

// userFiles writes passwd and group files into a temp dir.
func userFiles(t testing.TB, passwd, group string) (passwdPath, groupPath string) {
	t.Helper()
	dir := t.TempDir()
	passwdPath, groupPath = filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	if err := os.WriteFile(passwdPath, []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(groupPath, []byte(group), 0o644); err != nil {
		t.Fatal(err)
	}
	return passwdPath, groupPath
}

func TestLookupUser(t *testing.T) {
	passwd, group := userFiles(t, testPasswd, testGroup)
	tests := []struct {
		spec   string
		name   string
		uid    uint32
		gid    uint32
		groups []uint32
		home   string
	}{
		{spec: "alice", name: "alice", uid: 1000, gid: 1000, groups: []uint32{1000, 50, 10}, home: "/home/alice"},
		{spec: "1000", name: "alice", uid: 1000, gid: 1000, groups: []uint32{1000, 50, 10}, home: "/home/alice"},
		{spec: "root", name: "root", uid: 0, gid: 0, groups: []uint32{0, 10}, home: "/root"},
		{spec: "0", name: "root", uid: 0, gid: 0, groups: []uint32{0, 10}, home: "/root"},
		// Group given: it replaces the primary gid; member groups stay.
		{spec: "alice:staff", name: "alice", uid: 1000, gid: 50, groups: []uint32{50, 10}, home: "/home/alice"},
		{spec: "alice:2000", name: "alice", uid: 1000, gid: 2000, groups: []uint32{2000, 50, 10}, home: "/home/alice"},
		{spec: "1000:dev", name: "alice", uid: 1000, gid: 2000, groups: []uint32{2000, 50, 10}, home: "/home/alice"},
		{spec: "alice:777", name: "alice", uid: 1000, gid: 777, groups: []uint32{777, 50, 10}, home: "/home/alice"},
		// The first line matching by name or by id wins (runc's rule).
		{spec: "alice:1000", name: "alice", uid: 1000, gid: 1000, groups: []uint32{1000, 50, 10}, home: "/home/alice"},
		{spec: "1002", name: "1002", uid: 3000, gid: 3000, groups: []uint32{3000}, home: "/home/num"},
		{spec: "bob2", name: "bob2", uid: 1002, gid: 1002, groups: []uint32{1002, 50, 70}, home: "/home/bob2"},
		// Numeric ids nobody has: docker's gid 0, no name, HOME /.
		{spec: "5555", uid: 5555, gid: 0, groups: []uint32{0}, home: "/"},
		{spec: "5555:5556", uid: 5555, gid: 5556, groups: []uint32{5556}, home: "/"},
		{spec: "5555:staff", uid: 5555, gid: 50, groups: []uint32{50}, home: "/"},
		{spec: "4294967294", uid: 4294967294, gid: 0, groups: []uint32{0}, home: "/"},
		{spec: "nohome", name: "nohome", uid: 1001, gid: 1001, groups: []uint32{1001}, home: "/"},
		{spec: "emptyhome", name: "emptyhome", uid: 1, gid: 1, groups: []uint32{1}, home: "/"},
		{spec: "crlf", name: "crlf", uid: 1003, gid: 1003, groups: []uint32{1003}, home: "/home/crlf"},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			u, err := lookupUser(tt.spec, passwd, group)
			if err != nil {
				t.Fatal(err)
			}
			if u.spec != tt.spec || u.name != tt.name || u.uid != tt.uid || u.gid != tt.gid || u.home != tt.home || !slices.Equal(u.groups, tt.groups) {
				t.Errorf("got %+v, want name %q uid %d gid %d groups %v home %q", *u, tt.name, tt.uid, tt.gid, tt.groups, tt.home)
			}
		})
	}
}

func TestLookupUserErrors(t *testing.T) {
	passwd, group := userFiles(t, testPasswd, testGroup)
	tests := []struct {
		spec string
		want string
	}{
		{spec: "bob", want: `user "bob": no such user in ` + passwd},
		{spec: "bob:staff", want: `user "bob:staff": no such user in ` + passwd},
		{spec: "alicia", want: "no such user"}, // a member name, but no passwd line
		{spec: "broken", want: "no such user"}, // its line is malformed
		{spec: "+nisuser", want: "no such user"},
		{spec: "alice:nogroup", want: `user "alice:nogroup": no such group "nogroup" in ` + group},
		{spec: "5555:broken", want: "no such group"},
		{spec: "", want: "empty user name"},
		{spec: ":50", want: "empty user name"},
		{spec: "alice:", want: "empty group name"},
		{spec: "a:b:c", want: "user[:group]"},
		{spec: "4294967295", want: "out of range"},
		{spec: "99999999999", want: "out of range"},
		{spec: "alice:4294967295", want: "out of range"},
		{spec: "ali\x00ce", want: "NUL"},
		{spec: "alice\nroot", want: "NUL or newline"},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			u, err := lookupUser(tt.spec, passwd, group)
			if err == nil {
				t.Fatalf("got %+v, want an error", *u)
			}
			if _, ok := errors.AsType[*userError](err); !ok {
				t.Errorf("error %v is a %T, want *userError", err, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error: got %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestLookupUserMissingFiles(t *testing.T) {
	dir := t.TempDir()
	passwd, group := filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	u, err := lookupUser("1234:5678", passwd, group)
	if err != nil {
		t.Fatal(err)
	}
	if u.uid != 1234 || u.gid != 5678 || u.name != "" || u.home != "/" || !slices.Equal(u.groups, []uint32{5678}) {
		t.Errorf("numeric without files: got %+v", *u)
	}
	// uid 0 without a passwd entry still gets /root.
	if u, err := lookupUser("0", passwd, group); err != nil || u.home != "/root" || u.gid != 0 {
		t.Errorf("root without files: got %+v, %v", u, err)
	}
	if _, err := lookupUser("alice", passwd, group); err == nil || !strings.Contains(err.Error(), "no such user") {
		t.Errorf("name without passwd: got %v", err)
	}
	// With a passwd file but no group file, a user has just its primary group.
	passwd, _ = userFiles(t, testPasswd, "")
	if u, err := lookupUser("alice", passwd, group); err != nil || !slices.Equal(u.groups, []uint32{1000}) {
		t.Errorf("no group file: got %+v, %v", u, err)
	}
	if _, err := lookupUser("alice:staff", passwd, group); err == nil || !strings.Contains(err.Error(), "no such group") {
		t.Errorf("group name without group file: got %v", err)
	}
	// A file that cannot be read is not an unknown user.
	if _, err := lookupUser("alice", dir, group); err == nil {
		t.Error("passwd is a directory: got no error")
	} else if _, ok := errors.AsType[*userError](err); ok {
		t.Errorf("passwd is a directory: got a *userError %v", err)
	}
}

func TestUserEnv(t *testing.T) {
	base := []string{"PATH=/bin", "X=1"}
	alice := &userInfo{spec: "alice", name: "alice", uid: 1000, gid: 1000, home: "/home/alice"}
	tests := []struct {
		name string
		env  []string
		u    *userInfo
		want []string
	}{
		{name: "default root", env: base, want: []string{"HOME=/root", "PATH=/bin", "X=1"}},
		{name: "default root keeps HOME", env: []string{"HOME=/h"}, want: []string{"HOME=/h"}},
		{name: "user", env: base, u: alice, want: []string{"HOME=/home/alice", "LOGNAME=alice", "PATH=/bin", "USER=alice", "X=1"}},
		{name: "user keeps set values", env: []string{"HOME=/h", "USER=u", "LOGNAME=l"}, u: alice, want: []string{"HOME=/h", "LOGNAME=l", "USER=u"}},
		{name: "empty counts as unset", env: []string{"HOME=", "USER="}, u: alice, want: []string{"HOME=/home/alice", "LOGNAME=alice", "USER=alice"}},
		{name: "no name", env: nil, u: &userInfo{spec: "5555", uid: 5555, home: "/"}, want: []string{"HOME=/"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			orig := slices.Clone(tt.env)
			got := slices.Clone(userEnv(tt.env, tt.u))
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
			if !slices.Equal(tt.env, orig) {
				t.Errorf("input modified: %q, was %q", tt.env, orig)
			}
		})
	}
}

func TestCanSearch(t *testing.T) {
	type node struct{ uid, gid, mode uint32 }
	tree := map[string]node{
		"/":             {0, 0, 0o755},
		"/root":         {0, 0, 0o700},
		"/home":         {0, 0, 0o755},
		"/home/alice":   {1000, 1000, 0o700},
		"/srv":          {0, 50, 0o750},
		"/srv/app":      {0, 0, 0o755},
		"/pub":          {0, 0, 0o711},
		"/tmp":          {0, 0, 0o1777},
		"/home/noother": {1000, 0, 0o070},
	}
	stat := func(p string) (uint32, uint32, uint32, error) {
		n, ok := tree[p]
		if !ok {
			return 0, 0, 0, os.ErrNotExist
		}
		return n.uid, n.gid, n.mode, nil
	}
	alice := &userInfo{spec: "alice", uid: 1000, gid: 1000, groups: []uint32{1000, 50}}
	other := &userInfo{spec: "2000", uid: 2000, gid: 0, groups: []uint32{0}}
	tests := []struct {
		dir  string
		u    *userInfo
		want bool
	}{
		{"/", alice, true},
		{"/root", alice, false},
		{"/root", nil, true},
		{"/root", &userInfo{spec: "0"}, true},
		{"/home/alice", alice, true},
		{"/home/alice", other, false},
		{"/srv/app", alice, true}, // via group 50
		{"/srv/app", other, false},
		{"/pub", other, true},
		{"/tmp", other, true},
		{"/home/noother", alice, false}, // the owner's bits apply to the owner
		{"/home/noother", other, true},  // group 0
		{"/no/such/dir", other, true},   // not the explanation
	}
	for _, tt := range tests {
		if got := canSearch(tt.dir, tt.u, stat); got != tt.want {
			t.Errorf("canSearch(%q, %v): got %v, want %v", tt.dir, tt.u, got, tt.want)
		}
	}
}
