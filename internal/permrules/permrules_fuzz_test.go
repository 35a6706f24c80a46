package permrules

import (
	"errors"
	"strings"
	"testing"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// FuzzCompileDecide feeds Compile the rules a create request carries and
// Decide the paths user code opens. Refusals wrap ErrInvalid; an accepted
// policy decides every path without panicking, never gives the guard's
// root less than View, gives no path a permission no rule or default
// grants, and decides a path and its spellings ("/a/b", "a/b/", "//a//b")
// the same.
func FuzzCompileDecide(f *testing.F) {
	f.Add("*.pem", int32(1), int32(1), int32(0), false, "", "/keys/a.PEM", true)
	f.Add("/output/**", int32(4), int32(1), int32(5), true, "secrets", "/output/x/y", false)
	f.Add("secrets", int32(1), int32(2), int32(9), false, "", "/a/secrets/b", true)
	f.Add("/", int32(3), int32(2), int32(0), false, "", "/", true)
	f.Fuzz(func(t *testing.T, pattern string, perm, typ, prio int32, fold bool, preset, p string, isDir bool) {
		pol := &sbxv1.PathPolicy{Path: "/workspace", Preset: preset, Rules: []*sbxv1.PermissionRule{{
			Pattern: pattern, Permission: sbxv1.Permission(perm), Type: sbxv1.PatternType(typ),
			Priority: prio, CaseInsensitive: fold,
		}}}
		c, err := Compile(pol)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Compile: %v, not ErrInvalid", err)
			}
			return
		}
		if got := c.Decide("/", true); got < View {
			t.Fatalf("root decided %v, want at least view", got)
		}
		got := c.Decide(p, isDir)
		max := c.Default
		for _, r := range c.rules {
			max = maxPerm(max, r.perm)
		}
		if got > max && !(got == View && isDir) {
			t.Fatalf("%q decided %v, more than any rule or the default (%v)", p, got, max)
		}
		parts := strings.FieldsFunc(p, func(r rune) bool { return r == '/' })
		if len(parts) > 0 && !strings.Contains(p, "\x00") {
			for _, alt := range []string{"/" + strings.Join(parts, "/"), strings.Join(parts, "/") + "/", "//" + strings.Join(parts, "//")} {
				if g := c.Decide(alt, isDir); g != got {
					t.Fatalf("%q decided %v but %q decided %v", p, got, alt, g)
				}
			}
		}
	})
}

func maxPerm(a, b Perm) Perm {
	if a > b {
		return a
	}
	return b
}
