package sandbox

import (
	"errors"
	"strings"
	"testing"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// FuzzParseSelectors feeds the label selector parser what List requests
// carry. Refusals are InvalidArgument; an accepted term has a valid key and
// a known operator, and means what it says on labels built from it.
func FuzzParseSelectors(f *testing.F) {
	for _, s := range []string{"env=prod", "env!=prod", "env", "!env", "k==v", " tier = web ", "a=b=c", "!", "k!=v=w"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, term string) {
		sel, err := ParseSelectors([]string{term})
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("ParseSelectors(%q): %v, not InvalidArgument", term, err)
			}
			return
		}
		if len(sel) != 1 {
			t.Fatalf("ParseSelectors(%q) = %d selectors, want 1", term, len(sel))
		}
		s := sel[0]
		if !labelKeyRe.MatchString(s.Key) || strings.ContainsAny(s.Key, "=!") {
			t.Fatalf("ParseSelectors(%q): key %q", term, s.Key)
		}
		with := map[string]string{s.Key: s.Value}
		without := map[string]string{}
		other := map[string]string{s.Key: s.Value + "x"}
		want := map[string][3]bool{ // with, without, other
			"=":       {true, false, false},
			"!=":      {false, true, true},
			"exists":  {true, false, true},
			"!exists": {false, true, false},
		}
		w, ok := want[s.Op]
		if !ok {
			t.Fatalf("ParseSelectors(%q): operator %q", term, s.Op)
		}
		for i, labels := range []map[string]string{with, without, other} {
			if got := Matches(sel, labels); got != w[i] {
				t.Fatalf("%q on %v: got %v, want %v", term, labels, got, w[i])
			}
		}
	})
}
