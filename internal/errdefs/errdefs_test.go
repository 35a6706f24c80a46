package errdefs

import "testing"

func TestCollapseRepeats(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`image "x": image "x": not found (pull or import it first)`, `image "x": not found (pull or import it first)`},
		{"stat /p: stat /p: no such file or directory", "stat /p: no such file or directory"},
		{"a: a: a: b", "a: b"},
		{"a: b: a: b", "a: b: a: b"}, // not consecutive: both say something
		{"get sandbox x: sandbox \"x\": not found", "get sandbox x: sandbox \"x\": not found"},
		{"no prefix", "no prefix"},
		{"", ""},
	} {
		if got := CollapseRepeats(c.in); got != c.want {
			t.Errorf("CollapseRepeats(%q): got %q, want %q", c.in, got, c.want)
		}
	}
}
