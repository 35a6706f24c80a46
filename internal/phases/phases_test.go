package phases

import (
	"strings"
	"testing"
	"time"
)

// String lists each phase once, in the order first marked, as name=duration
// pairs that time.ParseDuration reads (sbx-bench parses them), then total;
// marking a name again adds to it.
func TestTimerString(t *testing.T) {
	tm := Start()
	steps := []struct {
		name string
		d    time.Duration
	}{{"a", 2 * time.Millisecond}, {"b", time.Millisecond}, {"a", 2 * time.Millisecond}}
	for _, s := range steps {
		tm.start = tm.start.Add(-s.d) // as if the phase had taken s.d
		tm.last = tm.last.Add(-s.d)
		tm.Mark(s.name)
	}
	fields := strings.Fields(tm.String())
	var names []string
	got := map[string]time.Duration{}
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			t.Fatalf("field %q of %q: want name=duration", f, tm.String())
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("field %q: %v", f, err)
		}
		names = append(names, k)
		got[k] = d
	}
	if want := "a b total"; strings.Join(names, " ") != want {
		t.Errorf("phases: got %q, want %q", strings.Join(names, " "), want)
	}
	for _, c := range []struct {
		name string
		min  time.Duration
	}{{"a", 4 * time.Millisecond}, {"b", time.Millisecond}, {"total", 5 * time.Millisecond}} {
		if got[c.name] < c.min || got[c.name] > c.min+time.Second {
			t.Errorf("%s: got %v, want about %v", c.name, got[c.name], c.min)
		}
	}
}
