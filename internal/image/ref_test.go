package image

import (
	"strings"
	"testing"

	"github.com/sbxdev/sbx/internal/errdefs"
)

func TestCheckRef(t *testing.T) {
	dgst := "sha256:" + strings.Repeat("ab", 32)
	for _, tc := range []struct {
		ref string
		ok  bool
	}{
		{"alpine", true},
		{"alpine:3.19", true},
		{"library/alpine:latest", true},
		{"index.docker.io/library/alpine:latest", true},
		{"localhost/x:1", true},
		{"localhost:5000/a/b:v1", true},
		{"127.0.0.1:5000/x:1", true},
		{"Example.COM/a_b/c__d/e--f.g:T_1.x-y", true},
		{"alpine@" + dgst, true},
		{"alpine:1@" + dgst, true},
		{"mine:1", true},
		{"", false},
		{"../../evil:1", false},
		{"../evil", false},
		{"..:1", false},
		{"./x:1", false},
		{"localhost/../x:1", false},
		{"x/../y:1", false},
		{"x/./y:1", false},
		{"a//b:1", false},
		{"/abs:1", false},
		{"x/:1", false},
		{"Upper:1", false},
		{"a\x00b:1", false},
		{"a\nb:1", false},
		{"a b:1", false},
		{"x_:1", false},
		{"x___y:1", false},
		{"-x:1", false},
		{"x:", false},
		{":1", false},
		{"x:-bad", false},
		{"x:a/b", false},
		{"x:" + strings.Repeat("t", 129), false},
		{strings.Repeat("a", 256) + ":1", false},
		{strings.Repeat("a/", 300) + "a", false},
		{"x@sha256:abc", false},
		{"x@md5:" + strings.Repeat("a", 32), false},
		{"reg.example:port/x:1", false},
		{"reg.example:123456/x:1", false},
		{"-reg.example/x:1", false},
	} {
		err := checkRef(tc.ref)
		if tc.ok && err != nil {
			t.Errorf("checkRef(%q) = %v; want ok", tc.ref, err)
		}
		if !tc.ok && !errdefs.IsInvalidArgument(err) {
			t.Errorf("checkRef(%q) = %v; want ErrInvalidArgument", tc.ref, err)
		}
		if !tc.ok && err != nil && len(err.Error()) > 400 {
			t.Errorf("checkRef(%q...): message of %d bytes; want it cut", tc.ref[:10], len(err.Error()))
		}
	}
}

func TestNormalizeTag(t *testing.T) {
	for _, tc := range []struct{ ref, want string }{
		{"mine:1", "index.docker.io/library/mine:1"},
		{"local/x", "index.docker.io/local/x:latest"},
		{"localhost:5000/x:2", "localhost:5000/x:2"},
	} {
		if got, err := normalizeTag(tc.ref); err != nil || got != tc.want {
			t.Errorf("normalizeTag(%q) = %q, %v; want %q", tc.ref, got, err, tc.want)
		}
	}
	if _, err := normalizeTag("x@sha256:" + strings.Repeat("0", 64)); !errdefs.IsInvalidArgument(err) {
		t.Errorf("normalizeTag(digest) = %v; want ErrInvalidArgument", err)
	}
}
