package idmap

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sbxdev/sbx/internal/errdefs"
)

func TestParseLimits(t *testing.T) {
	with := func(kv map[string]int64) Limits {
		l := DefaultLimits()
		for k, v := range kv {
			l[k] = v
		}
		return l
	}
	for _, tc := range []struct {
		in      string
		want    Limits
		wantErr string
	}{
		{in: "", want: DefaultLimits()},
		{in: "inotify_instances=16", want: with(map[string]int64{"inotify_instances": 16})},
		{in: " user_namespaces=0 , sigpending=100", want: with(map[string]int64{"user_namespaces": 0, "sigpending": 100})},
		{in: "inotify_instances", wantErr: `"inotify_instances": want name=value`},
		{in: "max_inotify_instances=1", wantErr: `"max_inotify_instances": unknown name (known: cgroup_namespaces,`},
		{in: "sigpending=-1", wantErr: `sigpending="-1": want an integer from 0 to 2147483647`},
		{in: "sigpending=2147483648", wantErr: `want an integer from 0 to 2147483647`},
		{in: "msgqueue=1k", wantErr: `msgqueue="1k"`},
	} {
		got, err := ParseLimits(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("ParseLimits(%q): got error %v, want InvalidArgument saying %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseLimits(%q): %v", tc.in, err)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("ParseLimits(%q) (-want +got):\n%s", tc.in, diff)
		}
		if back, err := ParseLimits(got.String()); err != nil || !cmp.Equal(back, got) {
			t.Errorf("ParseLimits(%q.String()) = %v, %v; want %v", tc.in, back, err, got)
		}
	}
}

func TestLimitsValidate(t *testing.T) {
	if err := DefaultLimits().Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
	for _, l := range []Limits{{"nope": 1}, {"sigpending": -1}, {"inotify_watches": 1 << 31}} {
		if err := l.Validate(); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Validate(%v): got %v, want InvalidArgument", l, err)
		}
	}
}

// TestLimitsClamp: a box never gets more than the host allows one user,
// and counters the host's kernel lacks are left out.
func TestLimitsClamp(t *testing.T) {
	l := Limits{"inotify_instances": 500, "inotify_watches": 100, "time_namespaces": 5}
	host := Limits{"inotify_instances": 128, "inotify_watches": 8192}
	got, lowered := l.Clamp(host)
	if want := (Limits{"inotify_instances": 128, "inotify_watches": 100}); !cmp.Equal(got, want) {
		t.Errorf("Clamp: got %v, want %v", got, want)
	}
	if want := []string{"inotify_instances 500 to 128"}; !cmp.Equal(lowered, want) {
		t.Errorf("Clamp lowered: got %v, want %v", lowered, want)
	}
}
